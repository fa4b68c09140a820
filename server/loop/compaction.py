"""Compaction: an older range of history replaced by a summary the agent's model writes.

A compaction summarises the surface nodes 0..end (the oldest, a former summary
included) and keeps the rest verbatim: the most recent `keep_recent` estimated tokens,
never starting the kept part at a tool result (a call and its result stay together).
It is recorded as one `context_message` (source "compaction", `compaction` set) with a
REPLACE surface op over that range: the model's history, a resume, a fork and the event
list derive the same history from it, and the replaced events stay readable.

A plugin serving `agent/compact` may write the summary instead; else the summary
request is the agent's own provider and model with a summarising system
prompt and the range as one transcript (tool output cut, the oldest part dropped when
it would not fit the window): it never carries tool schemas, so a tool call and its
result can never be torn apart in it. A failed summary records nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.kernel import seams as S
from server.kernel.abort import AbortSignal
from server.kernel.assembly import MessageAssembler
from server.kernel.content import plain_text, text_block
from server.kernel.errors import CodedError
from server.kernel.tokens import BYTES_PER_TOKEN, estimate_messages
from server.loop.agent import Agent
from server.loop.context import usage_message, used_tokens
from server.models import ModelRequest

SOURCE = c.Source(kind="compaction")
"""The source of a summary node (and of a compaction's one-shot turn)."""

SYSTEM = (
    "You compact a conversation so that it can continue within a limited context. "
    "Write a hand-off summary of the transcript you are given: the goal, what was done "
    "and decided, constraints and preferences stated, open questions, the next steps, "
    "and every detail the work still needs (names, paths, numbers, identifiers). "
    "Do not call tools. Answer with the summary only."
)

HEADER = "Summary of the earlier conversation (compacted):"
"""The first line of a summary node's text."""

MAX_SUMMARY_CHARS = 16_000
"""A summary longer than this is cut: compaction must shrink the context."""

TOOL_OUTPUT_CHARS = 2_000
"""Each tool result's share of the transcript (pi cuts at the same size)."""

MAX_TRANSCRIPT_CHARS = 400_000
"""The transcript's bound when the window is unknown (about 100k tokens)."""

OVERFLOW_CODES = frozenset({"CONTEXT_LENGTH_EXCEEDED"})
"""Error codes that say a request passed the model's context window: the
OpenAI-compatible adapter's mapping of `context_length_exceeded`, and the code a
plugin model's ERROR finish uses for it."""


@dataclass(frozen=True)
class Plan:
    """What a compaction replaces: surface nodes 0..end."""

    end: int
    first_seq: int
    last_seq: int
    messages: list[c.Message]
    """The projected messages of the range, in order."""
    kept: list[c.Message]
    """The projected messages after it."""


def is_tool_result(message: c.Message | None) -> bool:
    """Whether a history node is a tool result (never the first node kept)."""
    return message is not None and any(
        block.WhichOneof("block") == "tool_result" for block in message.content
    )


def plan(nodes: list[tuple[c.Message | None, int]], keep_tokens: int) -> Plan | str:
    """The range to compact keeping `keep_tokens` of recent history; else why none."""
    first_kept, kept = len(nodes), 0
    while first_kept > 0 and kept < keep_tokens:
        first_kept -= 1
        message = nodes[first_kept][0]
        if message is not None:
            kept += estimate_messages([message])
    while 0 < first_kept < len(nodes) and is_tool_result(nodes[first_kept][0]):
        first_kept -= 1  # keep the call with its result
    end = first_kept - 1
    messages = [message for message, _ in nodes[: end + 1] if message is not None]
    if not messages:
        return "nothing older than the recent history to compact"
    if len(messages) == 1 and _is_summary(messages[0]):
        return "the history older than the recent part is already one summary"
    kept_messages = [message for message, _ in nodes[end + 1 :] if message is not None]
    return Plan(end, nodes[0][1], nodes[end][1], messages, kept_messages)


def _is_summary(message: c.Message) -> bool:
    return plain_text(message.content).startswith(f'<context source="{SOURCE.kind}">')


def transcript(messages: list[c.Message], max_chars: int) -> str:
    """The range as text for the summariser: one line per block, the oldest cut first."""
    lines: list[str] = []
    for message in messages:
        role = "assistant" if message.role == c.ROLE_ASSISTANT else "user"
        for block in message.content:
            kind = block.WhichOneof("block")
            if kind == "text":
                lines.append(f"[{role}] {block.text.text}")
            elif kind == "tool_call":
                lines.append(f"[tool call {block.tool_call.name}] {block.tool_call.arguments}")
            elif kind == "tool_result":
                output = plain_text(block.tool_result.content)[:TOOL_OUTPUT_CHARS]
                lines.append(f"[tool result] {output}")
            elif kind is not None and kind != "reasoning":
                lines.append(f"[{role} {kind}]")
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = "[the oldest part is omitted]\n" + text[-max_chars:]
    return text


def summary_prompt(text: str, instructions: str) -> str:
    """The summary request's one user message."""
    focus = f"\nFocus on: {instructions}" if instructions else ""
    return f"<transcript>\n{text}\n</transcript>{focus}"


async def summarise(
    agent: Agent, messages: list[c.Message], instructions: str, signal: AbortSignal
) -> tuple[str, c.Provenance, c.Usage | None]:
    """The summary of `messages` by the agent's model; raises `CodedError` on failure."""
    session = agent.session
    header = session.request_header
    config = (
        header.config
        if header is not None and header.config.provider
        else c.ModelConfig(provider=agent.resolved_provider, model=agent.resolved_model)
    )
    policy = agent.context
    room = (policy.window - policy.reserve) * BYTES_PER_TOKEN * 3 // 4 if policy.window else 0
    text = transcript(messages, room or MAX_TRANSCRIPT_CHARS)
    request = ModelRequest(
        agent_id=agent.agent_id,
        session_id=session.session_id,
        turn=session.open_turn or session.max_turn,
        step=0,
        header=c.RequestHeader(config=config, system=SYSTEM),
        messages=[
            c.Message(role=c.ROLE_USER, content=[text_block(summary_prompt(text, instructions))])
        ],
        options=agent.options,
        purpose="compaction",
    )
    model = agent.runtime.models.get(config.provider)
    assembler = MessageAssembler()
    async for chunk in model.stream(request, signal):
        assembler.add(chunk)
    finish = assembler.finish
    if finish is None:
        raise CodedError("the summary stream ended without a finish", "MODEL_PROTOCOL")
    if finish.kind in (st.FINISH_KIND_ERROR, st.FINISH_KIND_ABORTED):
        raise CodedError(finish.message or "the summary request failed", finish.code)
    summary = plain_text(assembler.content).strip()
    if not summary:
        raise CodedError("the model wrote an empty summary", "COMPACTION_EMPTY")
    provenance = c.Provenance(provider=config.provider, model=config.model)
    return summary[:MAX_SUMMARY_CHARS], provenance, assembler.usage


@dataclass(frozen=True)
class Outcome:
    """A compaction's result: the summary event, or why nothing was compacted."""

    event: ev.SessionEvent | None
    reason: str = ""


async def compact(
    agent: Agent,
    trigger: ev.CompactionTrigger.ValueType,
    signal: AbortSignal,
    *,
    instructions: str = "",
    keep_tokens: int | None = None,
    request_id: str = "",
    turn: int = 0,
) -> Outcome:
    """Summarise and record; `turn` 0 wraps the summary node in a one-shot turn.

    Emits the live `compaction` events (started, then finished or failed) and the new
    `context_usage`. Raises what the summary request raised; the history is unchanged.
    """
    session = agent.session
    found = plan(
        session.projection.surface(),
        agent.context.keep_recent if keep_tokens is None else keep_tokens,
    )
    if isinstance(found, str):
        return Outcome(None, found)
    before, _ = used_tokens(session)
    emit_phase(agent, ae.AgentCompaction(phase=ae.COMPACTION_PHASE_STARTED, trigger=trigger,
                                         tokens_before=before))  # fmt: skip
    try:
        written = await agent.runtime.seams.waterfall(
            S.COMPACT,
            agent.agent_id,
            lambda: S.Compact(
                agent,
                turn or session.max_turn,
                0,
                signal,
                found.messages,
                instructions,
                trigger,
                before,
            ),  # fmt: skip
            "",
        )
        if written.strip():  # a plugin wrote it: no model request, no usage
            summary, provenance, usage = written.strip()[:MAX_SUMMARY_CHARS], c.Provenance(), None
        else:
            summary, provenance, usage = await summarise(
                agent, found.messages, instructions, signal
            )
    except Exception as error:
        emit_phase(agent, ae.AgentCompaction(phase=ae.COMPACTION_PHASE_FAILED, trigger=trigger,
                                             tokens_before=before, message=str(error)))  # fmt: skip
        raise
    if agent.disposed and not turn:  # nothing is appended to a disposed agent's log
        raise CodedError("the agent was disposed during the compaction", "DISPOSED")
    info = ev.Compaction(
        trigger=trigger,
        first_seq=found.first_seq,
        last_seq=found.last_seq,
        tokens_before=before,
        instructions=instructions,
        provenance=provenance,
        request_id=request_id,
        replaced_nodes=found.end + 1,
    )
    if usage is not None:
        info.usage.CopyFrom(usage)
    if session.request_header is not None:  # a replay from this summary needs no older event
        info.header.CopyFrom(session.request_header)
    message = ev.ContextMessage(
        content=[text_block(f"{HEADER}\n{summary}")],
        source=SOURCE,
        envelope=ev.CONTEXT_ENVELOPE_CONTEXT,
        compaction=info,
    )
    fixed = session.request_header.ByteSize() // BYTES_PER_TOKEN if session.request_header else 0
    info.tokens_after = fixed + estimate_messages([*found.kept, c.Message(content=message.content)])
    replace = ev.SurfaceOp(kind=ev.SURFACE_OP_KIND_REPLACE, start=0, end=found.end)
    event = record(agent, message, replace, turn)
    emit_phase(agent, ae.AgentCompaction(phase=ae.COMPACTION_PHASE_FINISHED, trigger=trigger,
                                         tokens_before=before, tokens_after=info.tokens_after,
                                         event_seq=event.seq))  # fmt: skip
    agent.emit(None, None, ae.AgentEvent(context_usage=usage_message(session, agent.context)))
    return Outcome(event)


def record(
    agent: Agent, message: ev.ContextMessage, replace: ev.SurfaceOp, turn: int
) -> ev.SessionEvent:
    """Append the summary node: in the open turn `turn`, else in a one-shot turn."""
    session = agent.session
    if turn:
        return session.add(message, surface_op=replace)
    number = session.max_turn + 1
    session.add(ev.TurnStart(turn=number, trigger=ev.TRIGGER_KIND_COMPACTION, source=SOURCE))
    try:
        return session.add(message, surface_op=replace)
    finally:
        session.add(ev.TurnEnd(turn=number, reason=ev.TurnEndReason(completed=ev.TurnCompleted())))
        agent.track_flush(number)


def emit_phase(agent: Agent, phase: ae.AgentCompaction) -> None:
    """The live `compaction` event."""
    agent.emit(None, None, ae.AgentEvent(compaction=phase))
