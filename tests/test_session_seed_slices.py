"""A loaded session's log is replayed a slice of events at a time (`seed_in_slices`), the
event loop running other tasks between two, into the state a replay at once gives."""

from __future__ import annotations

import asyncio

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.kernel.content import text_content
from server.sessions.repair import crash_closers
from server.sessions.session import SEED_SLICE, SessionLog


def stored_events(turns: int, open_tail: bool) -> list[ev.SessionEvent]:
    """A stored log of `turns` turns, a compaction halfway, and an open turn if asked."""
    events: list[ev.SessionEvent] = []

    def add(**payload: object) -> ev.SessionEvent:
        event = ev.SessionEvent(seq=len(events) + 1, **payload)  # type: ignore[arg-type]
        events.append(event)
        return event

    header = c.RequestHeader(system="S")
    for turn in range(1, turns + 1):
        add(turn_start=ev.TurnStart(turn=turn))
        add(request_header=ev.RequestHeaderLogged(header=header))
        header = c.RequestHeader(system=f"S {turn}")
        add(user_message=ev.UserMessage(content=text_content(f"prompt {turn}")))
        add(assistant_message=ev.AssistantMessage(content=text_content(f"answer {turn}")))
        add(turn_end=ev.TurnEnd(turn=turn))
        if turn == turns // 2:
            summary = add(user_message=ev.UserMessage(content=text_content("summary")))
            summary.surface_op.CopyFrom(
                ev.SurfaceOp(kind=ev.SURFACE_OP_KIND_REPLACE, start=0, end=turn)
            )
    if open_tail:
        add(turn_start=ev.TurnStart(turn=turns + 1))
        add(user_message=ev.UserMessage(content=text_content("never answered")))
        add(step_start=ev.StepStart(turn=turns + 1, step=1))
    return events


def state(log: SessionLog) -> tuple[object, ...]:
    return (
        log.derive_messages(),
        log.count,
        log.durable,
        log.max_turn,
        log.open_turn,
        log.request_header,
        log.events,
    )


async def test_a_long_log_is_replayed_a_slice_at_a_time_into_the_same_state() -> None:
    events = stored_events(2 * SEED_SLICE // 5 + 7, open_tail=True)
    events += crash_closers(events)  # as a load repairs a crash tail
    assert events[-1].turn_end.reason.HasField("interrupted")
    at_once = SessionLog("s", session_pb2.SessionHeader(), seed=events)
    sliced = SessionLog("s", session_pb2.SessionHeader())
    seen: list[int] = []
    running = True

    async def probe() -> None:
        while running:
            seen.append(len(sliced))
            await asyncio.sleep(0)

    task = asyncio.create_task(probe())
    await sliced.seed_in_slices(events)
    running = False
    await task
    assert state(sliced) == state(at_once)
    assert sorted({n for n in seen if 0 < n < len(events)}) == [SEED_SLICE, 2 * SEED_SLICE]
    assert sliced.derive_messages()[0].content == text_content("summary")
    assert sliced.open_turn == 0  # the closers ended the open turn


def test_the_closers_of_a_long_log_are_those_of_its_last_turn() -> None:
    events = stored_events(300, open_tail=True)
    tail = events[-3:]  # the open turn's start, its prompt, its step's start
    assert crash_closers(events) == crash_closers(tail)
    assert [e.seq for e in crash_closers(events)] == [len(events) + 1, len(events) + 2]
    assert crash_closers(stored_events(300, open_tail=False)) == []
