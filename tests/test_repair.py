"""Crash-tail repair: which closers a log gets, and their shape."""

from __future__ import annotations

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.sessions.repair import INTERRUPTED_TEXT, crash_closers
from server.sessions.session import SessionLog
from tests.invariants import check_log


def log_of(*payloads: tuple[str, object]) -> list[ev.SessionEvent]:
    session = SessionLog("s", session_pb2.SessionHeader())
    for _, payload in payloads:
        session.add(payload)  # type: ignore[arg-type]
    return session.events


TURN = ("turn_start", ev.TurnStart(turn=1, trigger=ev.TRIGGER_KIND_MESSAGE))
STEP = ("step_start", ev.StepStart(turn=1, step=1))
CALL_A = ("tool_call", ev.ToolCall(turn=1, step=1, call_id="a", name="sleep"))
CALL_B = ("tool_call", ev.ToolCall(turn=1, step=1, call_id="b", name="sleep"))
RESULT_A = ("tool_result", ev.ToolResult(turn=1, step=1, call_id="a"))
STEP_END = ("step_end", ev.StepEnd(turn=1, step=1))
TURN_END = ("turn_end", ev.TurnEnd(turn=1, reason=ev.TurnEndReason(completed=ev.TurnCompleted())))


def kinds(events: list[ev.SessionEvent]) -> list[str]:
    return [e.WhichOneof("payload") or "" for e in events]


def test_balanced_or_empty_log_gets_no_closers() -> None:
    assert crash_closers([]) == []
    assert crash_closers(log_of(TURN, STEP, STEP_END, TURN_END)) == []


def test_open_turn_gets_interrupted() -> None:
    events = log_of(TURN)
    closers = crash_closers(events)
    assert kinds(closers) == ["turn_end"]
    assert closers[0].turn_end.reason.WhichOneof("kind") == "interrupted"
    assert closers[0].seq == 2 and closers[0].create_time == events[-1].create_time
    check_log([*events, *closers])


def test_open_step_gets_step_end_then_turn_end() -> None:
    events = log_of(TURN, STEP)
    assert kinds(crash_closers(events)) == ["step_end", "turn_end"]


def test_unanswered_calls_get_synthetic_results_in_log_order() -> None:
    events = log_of(TURN, STEP, CALL_A, CALL_B)
    closers = crash_closers(events)
    assert kinds(closers) == ["tool_result", "tool_result", "step_end", "turn_end"]
    first, second = closers[0], closers[1]
    assert [first.tool_result.call_id, second.tool_result.call_id] == ["a", "b"]
    assert first.tool_result.is_error
    assert first.tool_result.content[0].text.text == INTERRUPTED_TEXT
    assert (first.tool_result.error.name, first.tool_result.error.code) == (
        "InterruptedError",
        "interrupted",
    )
    assert first.surface_op.kind == ev.SURFACE_OP_KIND_APPEND
    assert list(first.source_event_seqs) == [3]
    check_log([*events, *closers])


def test_answered_calls_and_earlier_turns_get_nothing() -> None:
    events = log_of(TURN, STEP, CALL_A, RESULT_A, CALL_B)
    assert [c.tool_result.call_id for c in crash_closers(events) if c.HasField("tool_result")] == [
        "b"
    ]
    later = log_of(TURN, STEP, CALL_A, STEP_END, ("turn_start", ev.TurnStart(turn=2)))
    assert kinds(crash_closers(later)) == ["turn_end"]


def test_no_results_after_a_closed_step() -> None:
    events = log_of(TURN, STEP, CALL_A, STEP_END)
    assert kinds(crash_closers(events)) == ["turn_end"]


def test_repaired_log_projects_the_synthetic_results() -> None:
    events = log_of(TURN, STEP, CALL_A)
    repaired = SessionLog("s", session_pb2.SessionHeader(), seed=[*events, *crash_closers(events)])
    (message,) = repaired.derive_messages()
    assert message.content[0].tool_result.tool_call_id == "a"


def test_calls_the_message_asked_for_but_never_logged_get_results_in_model_order() -> None:
    # Write-ahead: a crash between two calls leaves the second without a tool/call.
    message = ev.AssistantMessage(
        turn=1,
        step=1,
        content=[
            c.ContentBlock(tool_call=c.ToolCallBlock(id="a", name="sleep")),
            c.ContentBlock(tool_call=c.ToolCallBlock(id="b", name="sleep")),
        ],
    )
    events = log_of(TURN, STEP, ("assistant_message", message), CALL_A)
    closers = crash_closers(events)
    assert kinds(closers) == ["tool_result", "tool_result", "step_end", "turn_end"]
    a, b = closers[0], closers[1]
    assert (a.tool_result.call_id, list(a.source_event_seqs)) == ("a", [events[-1].seq])
    assert (b.tool_result.call_id, list(b.source_event_seqs)) == ("b", [])
    check_log([*events, *closers])
