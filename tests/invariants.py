"""The dev invariants of the loop, checked after every test as an oracle.

- sequence numbers are contiguous from 1;
- every event but the boundaries sits inside a turn; turns and steps are balanced
  and never nest;
- turn numbers strictly increase by one; steps run 1..M within each turn;
- every `tool/result` answers a `tool/call` of the same step;
- an `approval/requested` follows its `tool/call` in the same step; an
  `approval/resolved` answers a pending request, at most once, before the call's
  `tool/result`; a request never resolved is only left by a crash (its turn ends
  `interrupted`);
- an agent's status trace never repeats a status and nothing follows `disposed`.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import session_event_pb2 as ev


def check_log(events: Sequence[ev.SessionEvent]) -> None:
    """Assert the log invariants on a complete (quiescent) session log."""
    open_turn = 0
    open_step = 0
    last_turn = 0
    last_step = 0
    calls: set[str] = set()
    approvals: dict[str, str] = {}
    """Pending approval ids of the open step, with their call ids."""
    for index, event in enumerate(events, start=1):
        assert event.seq == index, f"seq {event.seq} at position {index}"
        kind = event.WhichOneof("payload")
        if kind == "turn_start":
            assert not open_turn, f"turn {event.turn_start.turn} opened inside turn {open_turn}"
            turn = event.turn_start.turn
            assert last_turn == 0 or turn == last_turn + 1, f"turn {turn} after {last_turn}"
            open_turn, last_turn, last_step = turn, turn, 0
            continue
        assert open_turn, f"{kind} at seq {index} is outside any turn"
        if kind == "turn_end":
            assert event.turn_end.turn == open_turn
            assert not approvals or event.turn_end.reason.HasField("interrupted"), (
                f"turn {open_turn} ended with approvals pending: {sorted(approvals)}"
            )
            approvals = {}
            assert not open_step, f"turn {open_turn} ended with step {open_step} open"
            open_turn = 0
        elif kind == "step_start":
            assert not open_step, "nested step"
            assert event.step_start.turn == open_turn
            assert event.step_start.step == last_step + 1, "steps must be contiguous"
            open_step = last_step = event.step_start.step
            calls = set()
            approvals = {}
        elif kind == "step_end":
            assert event.step_end.step == open_step, "step/end does not match step/start"
            open_step = 0
        elif kind == "tool_call":
            assert open_step, "tool/call outside a step"
            calls.add(event.tool_call.call_id)
        elif kind == "approval_requested":
            request = event.approval_requested
            assert open_step and request.call_id in calls, "approval/requested without its call"
            assert request.approval_id not in approvals, "approval requested twice"
            approvals[request.approval_id] = request.call_id
        elif kind == "approval_resolved":
            resolved = event.approval_resolved
            assert approvals.pop(resolved.approval_id, None) == resolved.call_id, (
                f"approval/resolved {resolved.approval_id} answers no pending request"
            )
        elif kind == "tool_result":
            assert event.tool_result.call_id not in approvals.values() or (
                event.tool_result.error.code == "interrupted"
            ), "tool/result before its approval was resolved"
            assert open_step or event.tool_result.error.code == "interrupted"
            # Crash repair also answers calls the model asked for but no tool/call logged.
            repaired = event.tool_result.error.code == "interrupted" and not event.source_event_seqs
            assert event.tool_result.call_id in calls or repaired, (
                "tool/result without its tool/call"
            )
        elif kind in ("assistant_chunk", "assistant_message", "request_header"):
            assert open_step, f"{kind} outside a step"
    assert not open_turn, f"turn {open_turn} never ended"


def check_status_trace(trace: Sequence[int]) -> None:
    """Assert the status trace is legal: no repeats, nothing after disposed."""
    previous: int = ae.AGENT_STATUS_IDLE
    for status in trace:
        assert status != previous, f"status {status} repeated"
        assert previous != ae.AGENT_STATUS_DISPOSED, "a status after disposed"
        previous = status
