"""Match conditions (`Subscription.conditions`): their rules, and matching one `HookCall`.

One set of rules for the server (which refuses a plugin whose conditions break them,
and evaluates them before each call), the conformance checker (which reports the same
problems, and probes a plugin with calls its conditions exclude) and this SDK (which
answers such a call "continue unchanged" without running the handler). Every condition
set must hold; within one list, one entry matching is enough. Agent labels are known to
the server alone: `call_matches` does not look at them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Sequence

from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev

CAPABILITY = "match_conditions"
"""The capability a plugin with conditions requires of the server."""

MAX_REGEX_CHARS = 1024
"""The longest `prompt_regex` accepted."""

TOOL_SEAMS = frozenset(
    {hs.SEAM_TOOLS_PRE_EXECUTE, hs.SEAM_TOOLS_POST_EXECUTE, hs.SEAM_TOOLS_RESULT,
     hs.SEAM_TOOLS_APPROVAL}
)  # fmt: skip
"""The seams whose calls are about one tool call: `conditions.tools` applies."""


def _kinds(message: type[ev.SessionEvent] | type[ae.AgentEvent], oneof: str) -> frozenset[str]:
    return frozenset(f.name for f in message.DESCRIPTOR.oneofs_by_name[oneof].fields)


EVENT_KINDS: dict[int, frozenset[str]] = {
    hs.SEAM_SESSION_EVENTS: _kinds(ev.SessionEvent, "payload"),
    hs.SEAM_AGENT_EVENTS: _kinds(ae.AgentEvent, "event"),
}
"""The seams whose calls carry an event, with the event kinds each may name."""


def prompt_text(content: Iterable[c.ContentBlock]) -> str:
    """The text a prompt condition sees: the text blocks, joined by newlines."""
    return "\n".join(block.text.text for block in content if block.HasField("text"))


def name_matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """Whether a name is one of `patterns`: names, or globs (`*`, `?`, `[...]`), whole."""
    names = frozenset(p for p in patterns if not _is_glob(p))
    globs = [p for p in patterns if _is_glob(p)]
    if not globs:
        return names.__contains__
    match = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in globs)).match
    return lambda name: name in names or match(name) is not None


def event_kinds(subscription: hs.Subscription) -> frozenset[str] | None:
    """The event kinds notified (both lists hold when both are given); None: every kind."""
    lists = [set(k) for k in (subscription.event_kinds, subscription.conditions.event_kinds) if k]
    return frozenset(set.intersection(*lists)) if lists else None


def invalid_conditions(index: int, subscription: hs.Subscription) -> str:
    """What is wrong with a subscription's conditions, naming it and the field; "" if none."""
    if not subscription.HasField("conditions"):
        return ""
    seam = subscription.seam
    where = f"subscriptions[{index}] ({_seam_name(seam)}): conditions"
    conditions = subscription.conditions
    if conditions.tools:
        if seam not in TOOL_SEAMS:
            return f"{where}.tools: applies only to the tool seams"
        if not all(conditions.tools):
            return f"{where}.tools: a pattern is empty"
    if conditions.event_kinds:
        known = EVENT_KINDS.get(seam)
        if known is None:
            return f"{where}.event_kinds: applies only to SEAM_SESSION_EVENTS and SEAM_AGENT_EVENTS"
        unknown = sorted(set(conditions.event_kinds) - known)
        if unknown:
            return f"{where}.event_kinds: unknown kinds {unknown} (known: {sorted(known)})"
    for name in ("prompt_prefix", "prompt_regex"):
        if getattr(conditions, name) and seam != hs.SEAM_PROMPT_SUBMIT:
            return f"{where}.{name}: applies only to SEAM_PROMPT_SUBMIT"
    if conditions.prompt_regex:
        if len(conditions.prompt_regex) > MAX_REGEX_CHARS:
            return f"{where}.prompt_regex: longer than {MAX_REGEX_CHARS} characters"
        try:
            re.compile(conditions.prompt_regex)
        except re.error as error:
            return f"{where}.prompt_regex: not a valid regular expression ({error})"
    if not all(conditions.agent_labels):
        return f"{where}.agent_labels: a label key is empty"
    return ""


def call_matches(subscription: hs.Subscription, call: hs.HookCall) -> bool:
    """Whether the server would make `call` under the subscription's conditions.

    Everything but the agent labels, which only the server knows.
    """
    return call_matcher(subscription)(call)


def call_matcher(subscription: hs.Subscription) -> Callable[[hs.HookCall], bool]:
    """`call_matches` for one subscription, its lists and regex prepared once."""
    agent_ids = frozenset(subscription.agent_ids)
    conditions = subscription.conditions
    kinds = event_kinds(subscription)
    named = name_matcher(conditions.tools) if conditions.tools else None
    prefix = conditions.prompt_prefix
    search = _searcher(conditions.prompt_regex) if conditions.prompt_regex else None

    def matches(call: hs.HookCall) -> bool:
        if agent_ids and call.agent_id not in agent_ids:
            return False
        payload = call.WhichOneof("payload")
        if kinds is not None and payload in ("session_event", "agent_event"):
            kind = (
                call.session_event.event.WhichOneof("payload")
                if payload == "session_event"
                else call.agent_event.event.WhichOneof("event")
            )
            if kind not in kinds:
                return False
        tool = tool_name(call)
        if named is not None and tool is not None and not named(tool):
            return False
        if payload == "prompt_submit":
            text = prompt_text(call.prompt_submit.content)
            if not text.startswith(prefix):
                return False
            if search is not None and search(text) is None:
                return False
        return True

    return matches


def _searcher(regex: str) -> Callable[[str], object]:
    """The regex's search; one that does not compile (refused at registration) finds nothing."""
    try:
        return re.compile(regex).search
    except re.error:
        return lambda text: None


def tool_name(call: hs.HookCall) -> str | None:
    """The tool a tool seam's call is about; None for other calls."""
    payload = call.WhichOneof("payload")
    if payload == "tool_pre_execute":
        return call.tool_pre_execute.invocation.name
    if payload == "tool_post_execute":
        return call.tool_post_execute.invocation.name
    if payload == "tool_result":
        return call.tool_result.invocation.name
    if payload == "tool_approval":
        return call.tool_approval.approval.tool_name
    return None


def _is_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


def _seam_name(seam: int) -> str:
    try:
        return hs.Seam.Name(seam)  # type: ignore[arg-type]
    except ValueError:
        return str(seam)
