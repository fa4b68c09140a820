"""Crash-tail repair: close a turn that a crash left open, so a reloaded log is balanced.

A log whose last turn has a `turn/start` but no `turn/end` gets, in order: a synthetic
error `tool/result` for each call of the open step that has no result, a `step/end`
if a step is open, and a `turn/end` with reason `interrupted`. The closers reuse the
last event's time; their sequence numbers continue the log. A balanced log gets none.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev

INTERRUPTED_TEXT = "Tool call interrupted by a crash; no result was recorded."


def crash_closers(events: Sequence[ev.SessionEvent]) -> list[ev.SessionEvent]:
    """The events that close the open tail of `events` (empty when it is balanced)."""
    open_turn: ev.TurnStart | None = None
    open_step: ev.StepStart | None = None
    calls: dict[str, ev.SessionEvent] = {}
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "turn_start":
            open_turn, open_step, calls = event.turn_start, None, {}
        elif kind == "turn_end":
            open_turn, open_step, calls = None, None, {}
        elif kind == "step_start":
            open_step, calls = event.step_start, {}
        elif kind == "step_end":
            open_step, calls = None, {}
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
        for call_event in calls.values():  # insertion order is log order
            call = call_event.tool_call
            result = add(
                tool_result=ev.ToolResult(
                    turn=call.turn,
                    step=call.step,
                    call_id=call.call_id,
                    content=[c.ContentBlock(text=c.TextBlock(text=INTERRUPTED_TEXT))],
                    is_error=True,
                    error=ev.ToolError(name="InterruptedError", code="interrupted"),
                )
            )
            result.surface_op.kind = ev.SURFACE_OP_KIND_APPEND
            result.source_event_seqs.append(call_event.seq)
        add(step_end=ev.StepEnd(turn=open_step.turn, step=open_step.step))
    add(
        turn_end=ev.TurnEnd(
            turn=open_turn.turn, reason=ev.TurnEndReason(interrupted=ev.TurnInterrupted())
        )
    )
    return closers
