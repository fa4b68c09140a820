"""How full an agent's context is, against its model's window.

The policy (window, output reserve, recent history kept) comes from the agent's
options, else the server's config (per provider), else the table of common models
(`server.kernel.tokens`). The size is the last step's reported usage (input + output)
plus an estimate of what the history gained since; with no report since the last
compaction (or from a provider that reports nothing), an estimate of the whole request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_pb2
from server.kernel.tokens import MAX_SHARE, estimate_bytes, estimate_messages, known_window

if TYPE_CHECKING:
    from server.loop.agent import Agent
    from server.loop.runtime import Runtime
    from server.sessions.session import SessionLog


@dataclass(frozen=True)
class ContextPolicy:
    """An agent's window and thresholds, in tokens."""

    window: int
    """The model's context window; 0 when unknown."""
    reserve: int
    """Kept free for the output."""
    keep_recent: int
    """Recent history a compaction keeps verbatim."""
    auto: bool
    """Whether a request that would pass `compact_at` compacts first."""
    compact_at: int
    """Where automatic compaction fires (window - reserve); 0 when it never does. A
    field, not a property: every step reads it."""


def policy_of(
    options: agent_pb2.AgentOptions, runtime: Runtime, provider: str, model: str
) -> ContextPolicy:
    """The policy of an agent created with `options` on `provider` and `model`."""
    if options.HasField("context_window_tokens"):
        window = options.context_window_tokens
    else:
        window = runtime.context_windows.get(provider) or known_window(model)
    reserve = (
        options.output_reserve_tokens
        if options.HasField("output_reserve_tokens")
        else runtime.output_reserve
    )
    keep = (
        options.keep_recent_tokens
        if options.HasField("keep_recent_tokens")
        else (runtime.keep_recent)
    )
    if window:  # a small window still leaves room to compact into
        reserve = min(reserve, window // MAX_SHARE)
        keep = min(keep, window // MAX_SHARE)
    auto = options.auto_compact if options.HasField("auto_compact") else True
    compact_at = window - reserve if auto and window else 0
    return ContextPolicy(window, reserve, keep, auto, compact_at)


def used_tokens(session: SessionLog) -> tuple[int, bool]:
    """The size of the session's next request, and whether it is an estimate only."""
    projection = session.projection
    _, items, length = session.history().split()
    if projection.usage_tokens:
        since = projection.messages_after(projection.usage_seq)
        return projection.usage_tokens + estimate_messages(since), bool(since)
    header = session.request_header
    fixed = estimate_bytes(header.ByteSize()) if header is not None else 0
    return fixed + estimate_messages(items[:length]), True


def usage_message(session: SessionLog, policy: ContextPolicy) -> ae.ContextUsage:
    """The `ContextUsage` of a session under `policy`."""
    used, estimated = used_tokens(session)
    return ae.ContextUsage(
        used_tokens=used,
        window_tokens=policy.window,
        reserve_tokens=policy.reserve,
        estimated=estimated,
        compact_at_tokens=policy.compact_at,
        keep_recent_tokens=policy.keep_recent,
    )


def report_context(agent: Agent) -> None:
    """The live `context_usage` event of `agent`."""
    agent.emit(None, None, ae.AgentEvent(context_usage=usage_message(agent.session, agent.context)))
