"""The conformance checker's parts: sample calls, and the rules an answer must follow."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from google.protobuf import unknown_fields

from agentloop.plugin.conditions import CAPABILITY as CONDITIONS
from agentloop.plugin.conditions import (
    EVENT_KINDS,
    call_matches,
    event_kinds,
    invalid_conditions,
)
from agentloop.plugin.seam_table import BY_PAYLOAD
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import approval_pb2 as ap
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev

NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")
SUBSCRIBABLE = {spec.seam for spec in BY_PAYLOAD.values()}


@dataclass
class Report:
    """PASS and FAIL lines, in the order they were checked."""

    lines: list[str] = field(default_factory=list)
    failed: int = 0
    unreachable: str = ""

    def ok(self, label: str, why: str = "") -> None:
        """A check passed."""
        self.lines.append(f"PASS {label}" + (f": {why}" if why else ""))

    def fail(self, label: str, why: str) -> None:
        """A check failed, and why."""
        self.failed += 1
        self.lines.append(f"FAIL {label}: {why}")

    def record(self, label: str, problems: Sequence[str]) -> None:
        """PASS when there are no problems, else one FAIL naming them."""
        if problems:
            self.fail(label, "; ".join(problems))
        else:
            self.ok(label)

    def render(self) -> str:
        """The report as printed."""
        if self.unreachable:
            return f"FAIL {self.unreachable}"
        verdict = f"{self.failed} check(s) failed" if self.failed else "the plugin conforms"
        return "\n".join([*self.lines, verdict])


def check_description(description: hs.DescribeResponse, offered: Sequence[str]) -> list[str]:
    """What the server would refuse in a description."""
    problems = []
    if not NAME.fullmatch(description.name):
        problems.append(f"name {description.name!r} must be 1-128 letters, digits, . _ : -")
    if description.protocol_version not in (0, 1):
        problems.append(f"protocol version {description.protocol_version} is not 1")
    unknown = sorted(set(description.capabilities) - set(offered))
    if unknown:
        problems.append(f"capabilities not offered: {unknown}")
    kinds = {f.name for f in ev.SessionEvent.DESCRIPTOR.oneofs_by_name["payload"].fields}
    seen = set()
    for index, subscription in enumerate(description.subscriptions):
        seam = (
            hs.Seam.Name(subscription.seam)
            if subscription.seam in hs.Seam.values()
            else str(subscription.seam)
        )
        if subscription.seam not in SUBSCRIBABLE:
            problems.append(f"{seam} cannot be subscribed to")
        if subscription.seam in seen:
            problems.append(f"{seam} is subscribed twice")
        seen.add(subscription.seam)
        if subscription.failure_policy not in hs.FailurePolicy.values():
            problems.append(f"{seam}: unknown failure policy {subscription.failure_policy}")
        if subscription.HasField("timeout") and subscription.timeout.ToNanoseconds() <= 0:
            problems.append(f"{seam}: a timeout of zero or less")
        bad_kinds = sorted(set(subscription.event_kinds) - kinds)
        if bad_kinds:
            problems.append(f"{seam}: unknown event kinds {bad_kinds}")
        if problem := invalid_conditions(index, subscription):
            problems.append(problem)
    conditioned = any(s.HasField("conditions") for s in description.subscriptions)
    if conditioned and CONDITIONS not in description.capabilities:
        problems.append(
            f"it declares match conditions without requiring the capability {CONDITIONS!r}"
            " (a server without them would call it for everything)"
        )
    names = [tool.name for tool in description.tools]
    problems.extend(
        f"tool name {name!r} is empty or repeated"
        for name in sorted(set(names))
        if not name or names.count(name) > 1
    )
    problems.extend(
        f"model provider name {model.provider!r} is not valid"
        for model in description.models
        if not NAME.fullmatch(model.provider)
    )
    if not (description.subscriptions or description.tools or description.models):
        problems.append("it subscribes to nothing and provides nothing")
    return problems


def text(value: str) -> list[c.ContentBlock]:
    """One text block."""
    return [c.ContentBlock(text=c.TextBlock(text=value))]


OUTSIDE_A_STEP = frozenset({"prompt_submit", "session_prefix", "turn_continuation", "turn_stop"})
"""The seams the spec calls where no step is running: their calls carry step 0."""


def sample_call(
    call_id: str, payload: str, *, tool: str = "", provider: str = "", observe_only: bool = False
) -> hs.HookCall:
    """A representative call of kind `payload`, as the server would send it."""
    invocation = hs.ToolInvocation(call_id="tc1", name=tool or "echo", arguments='{"text": "hi"}')
    output = hs.ToolOutput(content=text("hi"))
    payloads = {
        "prompt_submit": hs.PromptSubmitCall(content=text("hello"), source=c.Source(kind="user")),
        "session_prefix": hs.SessionPrefixCall(),
        "pre_step": hs.PreStepCall(system="You are a test."),
        "request": hs.RequestCall(config=c.ModelConfig(provider="scripted", model="m")),
        "step_result": hs.StepResultCall(
            message=c.Message(role=c.ROLE_ASSISTANT, content=text("hi"))
        ),
        "turn_continuation": hs.TurnContinuationCall(
            decision=d.ContinuationDecision(stop=d.ContinuationStop())
        ),
        "turn_stop": hs.TurnStopCall(),
        "tool_pre_execute": hs.ToolPreExecuteCall(invocation=invocation),
        "tool_post_execute": hs.ToolPostExecuteCall(invocation=invocation, output=output),
        "tool_execute": hs.ToolExecuteCall(invocation=invocation),
        "session_event": hs.SessionEventNotice(
            event=ev.SessionEvent(seq=1, turn_start=ev.TurnStart(turn=1))
        ),
        "agent_event": hs.AgentEventNotice(),
        "tool_result": hs.ToolResultNotice(invocation=invocation, output=output),
        "model_stream": hs.ModelStreamCall(
            provider=provider,
            messages=[c.Message(role=c.ROLE_USER, content=text("hello"))],
        ),
        "tool_approval": hs.ToolApprovalCall(
            approval=ap.ApprovalRequested(
                turn=1,
                step=1,
                approval_id="ap-check",
                call_id="tc1",
                tool_name=tool or "echo",
                arguments='{"text": "hi"}',
                requested_by="options.approval_required_tools",
            )
        ),
    }
    spec = BY_PAYLOAD.get(payload)
    kinds = {"tool_execute": hs.CALL_KIND_TOOL_EXECUTE, "model_stream": hs.CALL_KIND_MODEL_STREAM}
    kind = kinds.get(payload, hs.CALL_KIND_SEAM)
    if spec is not None and (spec.decision is None or observe_only):
        kind = hs.CALL_KIND_NOTIFICATION  # an observer's, or an observe-only subscription's
    step = 0 if payload in OUTSIDE_A_STEP else 1
    call = hs.HookCall(
        call_id=call_id, kind=kind, seam=spec.seam if spec else hs.SEAM_UNSPECIFIED,
        agent_id="checker", session_id="checker-session", turn=1, step=step,
        **{payload: payloads[payload]},  # type: ignore[arg-type]
    )  # fmt: skip
    call.timeout.FromSeconds(5)
    return call


UNMATCHED = "agentloop-checker-unmatched"
"""A tool name and a prompt text no condition of a real plugin is expected to match."""


def fitted(call: hs.HookCall, subscription: hs.Subscription) -> hs.HookCall | None:
    """`call` changed to match the subscription's conditions; None when none can be made.

    Its agent is one of `agent_ids`, its tool one the patterns name, its event of a kind
    asked for, its prompt the prefix and a word of the regex. A prompt regex no such
    guess matches is not solved: the call is left out. Agent labels are the server's
    alone.
    """
    fit = hs.HookCall()
    fit.CopyFrom(call)
    if subscription.agent_ids:
        fit.agent_id = subscription.agent_ids[0]
    conditions = subscription.conditions
    payload = call.WhichOneof("payload")
    if conditions.tools:
        _set_tool(fit, _a_name_of(conditions.tools[0]))
    kinds = event_kinds_of(subscription)
    if kinds and payload in ("session_event", "agent_event"):
        event = fit.session_event.event if payload == "session_event" else fit.agent_event.event
        getattr(event, sorted(kinds)[0]).SetInParent()
    if payload == "prompt_submit" and (conditions.prompt_prefix or conditions.prompt_regex):
        # The prefix, then a word of the regex, if one makes it match: a guess, not a solver.
        words = re.findall(r"\w+", conditions.prompt_regex)
        for guess in ("hello", *words):
            del fit.prompt_submit.content[:]
            fit.prompt_submit.content.extend(text(f"{conditions.prompt_prefix} {guess}".lstrip()))
            if call_matches(subscription, fit):
                break
    return fit if call_matches(subscription, fit) else None


def excluded(call: hs.HookCall, subscription: hs.Subscription) -> hs.HookCall | None:
    """`call` changed so that the subscription's conditions exclude it; None if none can be.

    An answered seam's call only: the plugin must answer it "continue unchanged".
    """
    conditions = subscription.conditions
    spec = BY_PAYLOAD.get(call.WhichOneof("payload") or "")
    if not subscription.HasField("conditions") or spec is None or spec.decision is None:
        return None
    out = hs.HookCall()
    out.CopyFrom(call)
    if conditions.tools:
        _set_tool(out, UNMATCHED)
    if out.WhichOneof("payload") == "prompt_submit":
        del out.prompt_submit.content[:]
        out.prompt_submit.content.extend(text(UNMATCHED))
    return None if call_matches(subscription, out) else out


def event_kinds_of(subscription: hs.Subscription) -> list[str]:
    """The event kinds a subscription is sent, known to its seam (empty: every kind)."""
    asked = event_kinds(subscription) or frozenset()
    return sorted(asked & EVENT_KINDS.get(subscription.seam, frozenset()))


def _a_name_of(pattern: str) -> str:
    """A tool name a pattern matches: a name is itself; a glob's wildcards filled in."""
    name, i = "", 0
    while i < len(pattern):
        char = pattern[i]
        close = pattern.find("]", i + 2) if char == "[" else -1
        if char in "*?":
            name += "x"
        elif close > i:  # a set: its first member; a complement: a rare character
            members = pattern[i + 1 : close]
            name += "\u2603" if members.startswith("!") else members[0]
            i = close
        else:
            name += char
        i += 1
    return name


def _set_tool(call: hs.HookCall, name: str) -> None:
    payload = call.WhichOneof("payload")
    if payload == "tool_approval":
        call.tool_approval.approval.tool_name = name
    elif payload in ("tool_pre_execute", "tool_post_execute", "tool_result"):
        getattr(call, payload).invocation.name = name


def check_result(call: hs.HookCall, answer: Sequence[hs.HandleResponse]) -> list[str]:
    """What the server would reject in the answer to `call`."""
    payload = call.WhichOneof("payload") or ""
    if payload == "model_stream":
        return _check_stream(answer)
    (response,) = answer
    if response.WhichOneof("kind") != "result":
        return ["a model chunk answered a call that is not model_stream"]
    result = response.result
    problems = []
    if len(unknown_fields.UnknownFieldSet(result)):
        problems.append("the result holds fields the protocol does not define")
    outcome = result.WhichOneof("outcome")
    if outcome == "error":
        if not result.error.message:
            problems.append("an error outcome without a message")
        return problems
    if outcome is not None and outcome != payload:
        problems.append(f"answered {outcome} to a {payload} call (malformed: fails closed)")
    return problems


def _check_stream(answer: Sequence[hs.HandleResponse]) -> list[str]:
    last = answer[-1]
    if last.WhichOneof("kind") == "result":
        if last.result.WhichOneof("outcome") == "error":
            return []  # a failed model call, answered correctly
        return ["a model call ended by a result without an error (it needs a finish chunk)"]
    kinds = [r.chunk.chunk.WhichOneof("chunk") for r in answer]
    if kinds.count("finish") != 1:
        return ["a model call must end with exactly one finish chunk"]
    return []
