"""What a turn said and did, read off its events: text, tool calls with results, usage.

A turn's stream interleaves the text blocks of the model's answer with the argument
JSON of its tool calls (`block_delta` carries both), and parallel tool calls finish in
any order. `TurnView` reads the turn's recorded events instead: the text of each
assistant message, each tool call paired with its result by call id, the usage summed
over the steps, and how the turn ended:

    view = await (await client.send("a", "sleep 2 then say done")).view()
    print(view.text)                        # "done sleeping"
    for call in view.tool_calls:
        print(call.name, call.arguments, "->", call.result_text)
    print(view.end_reason, view.usage.output_tokens)

`TextDeltas` does the same for text while it streams: it yields the deltas of text
blocks only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentloop.v1 import content_pb2, stream_pb2
from agentloop.v1 import session_event_pb2 as ev


def text_of(blocks: Iterable[content_pb2.ContentBlock]) -> str:
    """The text blocks of some content, joined ("" when there is none)."""
    return "".join(block.text.text for block in blocks if block.WhichOneof("block") == "text")


@dataclass(frozen=True)
class ToolCallView:
    """One tool call of the turn and its result (None while it has none)."""

    call_id: str
    name: str
    arguments: str
    """The arguments as the model wrote them (JSON text)."""
    step: int
    result: ev.ToolResult | None = None

    @property
    def result_text(self) -> str:
        """The text of the result ("" without a result)."""
        return text_of(self.result.content) if self.result is not None else ""

    @property
    def is_error(self) -> bool:
        """True when the tool failed (or was refused, timed out, cancelled)."""
        return self.result is not None and self.result.is_error

    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON (raises ValueError when they are not JSON)."""
        return json.loads(self.arguments or "{}")


@dataclass(frozen=True)
class TurnView:
    """A turn's text, tool calls, usage and end, from its events."""

    turn: int = 0
    """The turn's number in its session (0 when no `turn_start` was read)."""
    text: str = ""
    """The assistant's text over every step, one message per line; no tool arguments."""
    final_text: str = ""
    """The text of the last assistant message (the answer after the tools ran)."""
    tool_calls: tuple[ToolCallView, ...] = ()
    """Every tool call in the order the model made them, each with its result."""
    usage: content_pb2.Usage = field(default_factory=content_pb2.Usage)
    """Tokens over every step of the turn."""
    steps: int = 0
    """How many steps (model requests) the turn ran."""
    end_reason: str = ""
    """`completed`, `max_tokens`, `aborted`, `error`, `disposed`, `rejected`, `interrupted`;
    `dropped` when a cancel dropped the message; "" when the turn has not ended."""
    end_detail: str = ""
    """The end's own words: the abort or rejection reason, the error message."""
    end: ev.SessionEvent | None = None
    """The `turn_end` (or `message_dropped`) event."""

    @classmethod
    def of(cls, events: Iterable[ev.SessionEvent]) -> TurnView:
        """The view of one turn's events (chunks are not needed and may be left out)."""
        turn = steps = 0
        texts: list[str] = []
        calls: dict[str, ToolCallView] = {}
        results: dict[str, ev.ToolResult] = {}
        usage = content_pb2.Usage()
        end: ev.SessionEvent | None = None
        reason = detail = ""
        for event in events:
            kind = event.WhichOneof("payload")
            if kind == "turn_start":
                turn = event.turn_start.turn
            elif kind == "step_start":
                steps += 1
            elif kind == "assistant_message":
                message = event.assistant_message
                texts.append(text_of(message.content))
                usage.input_tokens += message.usage.input_tokens
                usage.output_tokens += message.usage.output_tokens
                usage.cached_input_tokens += message.usage.cached_input_tokens
            elif kind == "tool_call":
                c = event.tool_call
                calls[c.call_id] = ToolCallView(c.call_id, c.name, c.arguments, c.step)
            elif kind == "tool_result":
                results[event.tool_result.call_id] = event.tool_result
            elif kind == "turn_end":
                end = event
                reason, detail = _ending(event.turn_end.reason)
            elif kind == "message_dropped":
                end, reason, detail = event, "dropped", event.message_dropped.reason
        paired = tuple(
            ToolCallView(c.call_id, c.name, c.arguments, c.step, results.get(c.call_id))
            for c in calls.values()
        )
        spoken = [text for text in texts if text]
        return cls(
            turn=turn,
            text="\n".join(spoken),
            final_text=spoken[-1] if spoken else "",
            tool_calls=paired,
            usage=usage,
            steps=steps,
            end_reason=reason,
            end_detail=detail,
            end=end,
        )


def _ending(reason: ev.TurnEndReason) -> tuple[str, str]:
    kind = reason.WhichOneof("kind") or ""
    if kind == "aborted":
        return kind, reason.aborted.reason
    if kind == "rejected":
        return kind, reason.rejected.reason
    if kind == "error":
        return kind, reason.error.message
    return kind, ""


class TextDeltas:
    """Picks the text deltas out of a stream of events (tool-call arguments left out).

    `deltas.of(event)` returns the text an `assistant_chunk` adds to a text block, and
    "" for anything else: feed it every event of a turn, in order.
    """

    def __init__(self) -> None:
        self._text_blocks: set[tuple[int, int]] = set()

    def of(self, event: ev.SessionEvent) -> str:
        """The text `event` adds to the answer ("" when it adds none)."""
        if event.WhichOneof("payload") != "assistant_chunk":
            return ""
        chunk = event.assistant_chunk
        kind = chunk.chunk.WhichOneof("chunk")
        if kind == "block_start":
            if chunk.chunk.block_start.kind == stream_pb2.BLOCK_KIND_TEXT:
                self._text_blocks.add((chunk.step, chunk.chunk.block_start.index))
        elif kind == "block_delta":
            delta = chunk.chunk.block_delta
            if (chunk.step, delta.index) in self._text_blocks:
                return delta.text
        return ""
