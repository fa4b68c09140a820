"""Pure rendering of agentloop events for the command-line client (no transport here).

Two views share these helpers: `TurnView` renders one turn as a conversation (text
deltas inline, one line per tool call and result), and `event_line` / `agent_event_line`
render the raw log one compact line per event for `agentloop tail`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from agentloop.v1 import (
    agent_event_pb2,
    agent_pb2,
    content_pb2,
    session_event_pb2,
    stream_pb2,
)

V = TypeVar("V", bound=int)

DIM = "\x1b[2m"
RESET = "\x1b[0m"
LINE_LIMIT = 120
"""Longest summary `tail` prints for one text; the rest is elided."""


def enum_word(enum_name: str, prefix: str) -> str:
    """`AGENT_STATUS_RUNNING` with prefix `AGENT_STATUS_` → `running`."""
    return enum_name.removeprefix(prefix).lower()


def word_of(name: Callable[[V], str], value: V, prefix: str) -> str:
    """The word of an enum value; `unknown(7)` for a value newer than this client.

    Enums may grow: a client must not fail on a value it does not know.
    """
    try:
        return enum_word(name(value), prefix)
    except ValueError:
        return f"unknown({value})"


def status_word(status: agent_event_pb2.AgentStatus.ValueType) -> str:
    """The lowercase word of an `AgentStatus` value, e.g. "idle"."""
    return word_of(agent_event_pb2.AgentStatus.Name, status, "AGENT_STATUS_")


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """Squash newlines and elide past `limit` characters, for one-line summaries."""
    flat = text.replace("\r", "").replace("\n", "⏎")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def content_text(blocks: Iterable[content_pb2.ContentBlock]) -> str:
    """The readable text of content blocks: text and reasoning as-is, tool blocks in brief."""
    parts: list[str] = []
    for block in blocks:
        kind = block.WhichOneof("block")
        if kind == "text":
            parts.append(block.text.text)
        elif kind == "reasoning":
            parts.append(f"(thinking) {block.reasoning.text}")
        elif kind == "tool_call":
            parts.append(f"{block.tool_call.name}({block.tool_call.arguments})")
        elif kind == "tool_result":
            parts.append(content_text(block.tool_result.content))
    return " ".join(p for p in parts if p)


def source_word(source: content_pb2.Source) -> str:
    """`user`, or `plugin:name` when the producer is named; empty kind means user."""
    kind = source.kind or "user"
    return f"{kind}:{source.name}" if source.name else kind


def turn_end_text(end: session_event_pb2.TurnEnd) -> str:
    """The closing line of a turn, e.g. `[turn 3 aborted: user interrupt]`."""
    reason = end.reason
    kind = reason.WhichOneof("kind") or "unknown"
    detail = ""
    if kind == "aborted":
        detail = f": {reason.aborted.reason or 'cancelled'}"
    elif kind == "rejected":
        detail = f": {reason.rejected.reason}" if reason.rejected.reason else ""
    elif kind == "error":
        err = reason.error
        code = f" ({err.code})" if err.code else ""
        detail = f" at step {err.step}: {err.message}{code}"
    return f"[turn {end.turn} {kind.replace('_', ' ')}{detail}]"


def turn_succeeded(end: session_event_pb2.TurnEnd) -> bool:
    """Whether a turn ended well: completed, or truncated at the token limit."""
    return end.reason.WhichOneof("kind") in ("completed", "max_tokens")


def tool_result_text(name: str, result: session_event_pb2.ToolResult) -> str:
    """`name: text`, with errors marked `✗` and their code."""
    text = one_line(content_text(result.content))
    if not result.is_error:
        return f"{name}: {text}"
    code = result.error.code or result.error.name
    return f"{name} ✗ error{f' ({code})' if code else ''}: {text}"


def chunk_summary(chunk: stream_pb2.StreamChunk) -> str:
    """One stream chunk in brief: a delta is just its (quoted) text."""
    kind = chunk.WhichOneof("chunk")
    if kind == "block_delta":
        return repr(chunk.block_delta.text)
    if kind == "block_start":
        start = chunk.block_start
        block = word_of(stream_pb2.BlockKind.Name, start.kind, "BLOCK_KIND_")
        tool = f" {start.tool_name} {start.tool_call_id}" if start.tool_name else ""
        return f"start #{start.index} {block}{tool}"
    if kind == "block_end":
        return f"end #{chunk.block_end.index}"
    if kind == "usage":
        return f"usage in={chunk.usage.input_tokens} out={chunk.usage.output_tokens}"
    if kind == "finish":
        fin = chunk.finish
        word = word_of(stream_pb2.FinishKind.Name, fin.kind, "FINISH_KIND_")
        return " ".join(x for x in ("finish", word, fin.message, fin.code) if x)
    return kind or "?"


def event_summary(event: session_event_pb2.SessionEvent) -> str:
    """The human-readable summary of one session event (without seq and kind)."""
    kind = event.WhichOneof("payload")
    if kind == "turn_start":
        ts = event.turn_start
        trigger = word_of(session_event_pb2.TriggerKind.Name, ts.trigger, "TRIGGER_KIND_")
        return f"turn {ts.turn} ({trigger}, {source_word(ts.source)})"
    if kind == "user_message":
        m = event.user_message
        return f"{source_word(m.source)}: {one_line(content_text(m.content))}"
    if kind == "prompt_blocked":
        b = event.prompt_blocked
        return f"⚑ {b.reason}: {one_line(content_text(b.content))}"
    if kind == "context_message":
        c = event.context_message
        return f"{source_word(c.source)}: {one_line(content_text(c.content))}"
    if kind == "steering_message":
        s = event.steering_message
        return f"turn {s.turn} {source_word(s.source)}: {one_line(content_text(s.content))}"
    if kind in ("step_start", "step_end"):
        step = event.step_start if kind == "step_start" else event.step_end
        return f"turn {step.turn} step {step.step}"
    if kind == "request_header":
        h = event.request_header
        why = word_of(session_event_pb2.HeaderReason.Name, h.reason, "HEADER_REASON_")
        cfg = h.header.config
        return f"{why} {cfg.provider}/{cfg.model}, {len(h.header.tools)} tools"
    if kind == "assistant_chunk":
        return chunk_summary(event.assistant_chunk.chunk)
    if kind == "assistant_message":
        a = event.assistant_message
        return f"turn {a.turn} step {a.step}: {one_line(content_text(a.content))}"
    if kind == "tool_call":
        call = event.tool_call
        return f"{call.call_id} {call.name}({one_line(call.arguments)})"
    if kind == "tool_result":
        return tool_result_text(event.tool_result.call_id, event.tool_result)
    if kind == "turn_end":
        return turn_end_text(event.turn_end).strip("[]")
    return ""


def event_line(event: session_event_pb2.SessionEvent) -> str:
    """`seq kind summary`: one line of `tail` per session event."""
    kind = event.WhichOneof("payload") or "unknown"
    return f"{event.seq:>5} {kind:<17} {event_summary(event)}".rstrip()


def agent_event_line(event: agent_event_pb2.AgentEvent) -> str:
    """A live agent event in one line, e.g. `· status running`."""
    kind = event.WhichOneof("event") or "unknown"
    detail = ""
    if kind == "status":
        detail = status_word(event.status.status)
    elif kind == "queued":
        q = event.queued
        steer = " (steering)" if q.steering else ""
        detail = f"{source_word(q.source)}{steer}: {one_line(content_text(q.content))}"
    elif kind == "error":
        e = event.error
        code = f" ({e.code})" if e.code else ""
        detail = f"turn {e.turn} step {e.step}: {e.message}{code}"
    elif kind == "created":
        detail = f"session {event.created.session_id}"
    elif kind == "session_start":
        src = event.session_start.source
        detail = word_of(agent_event_pb2.SessionStartSource.Name, src, "SESSION_START_SOURCE_")
    return f"      · {kind.replace('_', ' ')} {detail}".rstrip()


def agents_table(agents: Iterable[agent_pb2.Agent]) -> str:
    """A left-aligned table of agent id, status and session id."""
    rows = [("AGENT", "STATUS", "SESSION")]
    rows += [(a.agent_id, status_word(a.status), a.session_id) for a in agents]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}".rstrip() for r in rows)


class TurnView:
    """Renders the session events of one turn as a conversation, for `agentloop send`.

    Text deltas are written inline as they arrive; every other output is a whole
    line, so the view remembers whether the cursor is mid-line. Delta kinds are known
    only from their block start, hence the index → kind map per step.
    """

    def __init__(self, color: bool = False) -> None:
        self.color = color
        self.at_line_start = True
        self._kinds: dict[tuple[int, int, int], stream_pb2.BlockKind.ValueType] = {}
        self._tool_names: dict[str, str] = {}
        self._depth: dict[str, int] = {}
        """Each sub-agent that reported, and its depth below the agent (children: 1)."""

    def _break(self) -> str:
        """A newline if inline text is pending, so that the next output starts a line."""
        out = "" if self.at_line_start else "\n"
        self.at_line_start = True
        return out

    def _line(self, text: str) -> str:
        """A whole line, on a line of its own."""
        return self._break() + text + "\n"

    def _inline(self, text: str) -> str:
        if text:
            self.at_line_start = text.endswith("\n")
        return text

    def _dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.color else text

    def render(self, event: session_event_pb2.SessionEvent) -> str:
        """The text to write for one event; empty when the event shows nothing."""
        kind = event.WhichOneof("payload")
        if kind == "assistant_chunk":
            return self._chunk(event.assistant_chunk)
        if kind == "tool_call":
            call = event.tool_call
            self._tool_names[call.call_id] = call.name
            return self._line(f"→ tool {call.name}({call.arguments})")
        if kind == "tool_result":
            res = event.tool_result
            name = self._tool_names.get(res.call_id, res.call_id)
            return self._line("← " + tool_result_text(name, res))
        if kind == "prompt_blocked":
            return self._line(f"⚑ blocked: {event.prompt_blocked.reason}")
        if kind == "message_dropped":
            return self._line(f"⚑ dropped: {event.message_dropped.reason}")
        if kind == "steering_message":
            return self._line(f"↪ steering: {content_text(event.steering_message.content)}")
        if kind == "context_message":
            c = event.context_message
            return self._line(f"+ context ({source_word(c.source)}): {content_text(c.content)}")
        if kind == "turn_end":
            return self._line(turn_end_text(event.turn_end))
        return ""

    def _chunk(self, chunk_event: session_event_pb2.AssistantChunk) -> str:
        chunk = chunk_event.chunk
        which = chunk.WhichOneof("chunk")
        turn, step = chunk_event.turn, chunk_event.step
        if which == "block_start":
            start = chunk.block_start
            self._kinds[(turn, step, start.index)] = start.kind
            if start.kind == stream_pb2.BLOCK_KIND_REASONING:
                out = self._break() + self._dim("(thinking) ")
                self.at_line_start = False
                return out
            return ""
        if which == "block_delta":
            delta = chunk.block_delta
            # A block started before the stream did (a steer joins mid-step) is most
            # likely text: better shown than silently dropped.
            kind = self._kinds.get((turn, step, delta.index), stream_pb2.BLOCK_KIND_TEXT)
            if kind == stream_pb2.BLOCK_KIND_TEXT:
                return self._inline(delta.text)
            if kind == stream_pb2.BLOCK_KIND_REASONING:
                self.at_line_start = False
                return self._dim(delta.text)
            return ""  # tool arguments: shown whole by the tool_call line
        if which == "block_end":
            ended = self._kinds.get((turn, step, chunk.block_end.index))
            return self._break() if ended == stream_pb2.BLOCK_KIND_REASONING else ""
        return ""

    def progress(self, progress: agent_event_pb2.ChildProgress) -> str:
        """A sub-agent's step or end, as a branch under the call that made it.

        Each sub-agent gets a branch the first time it reports, under its parent's
        branch (a grandchild's reports bubble up to this agent too); its later reports
        are lines of that branch: the tree of work grows as it happens.
        """
        child = progress.child_agent_id
        first = child not in self._depth
        if first:  # under its parent's branch (a sub-agent of this agent's: one deeper)
            self._depth[child] = self._depth.get(progress.parent_agent_id, 0) + 1
        pad = "  " + "│   " * (self._depth[child] - 1)
        head = ""
        if first:
            call = self._tool_names.get(progress.tool_call_id, "call")
            head = self._line(f"{pad}├─ sub-agent {child} ({call} {progress.tool_call_id})")
        state = f"step {progress.step} {progress.state}" if progress.step else progress.state
        text = f": {one_line(progress.text)}" if progress.text else ""
        return head + self._line(self._dim(f"{pad}│   {state}{text}"))

    def finish(self) -> str:
        """A final newline if inline text is still pending."""
        return self._break()
