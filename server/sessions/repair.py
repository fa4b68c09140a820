"""Crash-tail repair: close a turn that a crash left open, so a reloaded log is balanced.

A log whose last turn has a `turn/start` but no `turn/end` gets, in order: a synthetic
error `tool/result` for each call of the open step that has no result, a `step/end`
if a step is open, and a `turn/end` with reason `interrupted`. The calls are those of
the step's assistant message, in model order (with write-ahead, a crash can land
between two of them, so a call may have no `tool/call` yet: its result then names no
source event), then any other call the step logged. The closers reuse the
last event's time; their sequence numbers continue the log. A balanced log gets none.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev

INTERRUPTED_TEXT = "Tool call interrupted by a crash; no result was recorded."


def crash_closers(events: Sequence[ev.SessionEvent]) -> list[ev.SessionEvent]:
    """The events that close the open tail of `events` (empty when it is balanced).

    Only the events from the last turn boundary on are read (a `turn/start` or a
    `turn/end` resets everything the closers depend on): the cost of a long log's load
    is that of its last turn, not of its length.
    """
    tail = _last_turn(events)
    if tail is None:
        return []
    return _closers(events[tail:])


def _last_turn(events: Sequence[ev.SessionEvent]) -> int | None:
    """Where the last turn starts, if it is open (no `turn/end` after its `turn/start`)."""
    for i in range(len(events) - 1, -1, -1):
        kind = events[i].WhichOneof("payload")
        if kind == "turn_end":
            return None
        if kind == "turn_start":
            return i
    return None


def _closers(events: Sequence[ev.SessionEvent]) -> list[ev.SessionEvent]:
    open_turn: ev.TurnStart | None = None
    open_step: ev.StepStart | None = None
    asked: list[str] = []
    """The call ids the open step's assistant message asked for, in model order."""
    calls: dict[str, ev.SessionEvent | None] = {}
    """Calls of the open step without a result, with their `tool/call` if logged."""
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "turn_start":
            open_turn, open_step, calls, asked = event.turn_start, None, {}, []
        elif kind == "turn_end":
            open_turn, open_step, calls, asked = None, None, {}, []
        elif kind == "step_start":
            open_step, calls, asked = event.step_start, {}, []
        elif kind == "step_end":
            open_step, calls, asked = None, {}, []
        elif kind == "assistant_message":
            asked = [
                b.tool_call.id for b in event.assistant_message.content if b.HasField("tool_call")
            ]
            calls.update((call_id, None) for call_id in asked)
        elif kind == "tool_call":
            calls[event.tool_call.call_id] = event
        elif kind == "tool_result":
            calls.pop(event.tool_result.call_id, None)
    if open_turn is None:
        return []
    last = events[-1]
    closers: list[ev.SessionEvent] = []

    def add(**payload: object) -> ev.SessionEvent:
        seq, when = last.seq + 1 + len(closers), last.create_time
        event = ev.SessionEvent(seq=seq, create_time=when, **payload)  # type: ignore[arg-type]
        closers.append(event)
        return event

    if open_step is not None:
        order = [i for i in asked if i in calls] + [i for i in calls if i not in asked]
        for call_id in order:
            call_event = calls[call_id]
            result = add(
                tool_result=ev.ToolResult(
                    turn=open_step.turn,
                    step=open_step.step,
                    call_id=call_id,
                    content=[c.ContentBlock(text=c.TextBlock(text=INTERRUPTED_TEXT))],
                    is_error=True,
                    error=ev.ToolError(name="InterruptedError", code="interrupted"),
                )
            )
            result.surface_op.kind = ev.SURFACE_OP_KIND_APPEND
            if call_event is not None:
                result.source_event_seqs.append(call_event.seq)
        add(step_end=ev.StepEnd(turn=open_step.turn, step=open_step.step))
    add(
        turn_end=ev.TurnEnd(
            turn=open_turn.turn, reason=ev.TurnEndReason(interrupted=ev.TurnInterrupted())
        )
    )
    return closers
