"""Group commit under load: a loaded loop gathers a few passes of writes into one commit.

Counted in loop passes (`sleep(0)`), never in time: a quiet loop starts the commit one
pass after the first write (at once when nothing else is ready to run), a loaded one
(`GATHER_BUSY` callbacks still ready) waits up to `GATHER_PASSES` passes, and nothing
is published before its commit either way. For a store a round trip away (`remote`),
one ready callback already counts as load. On uvloop, whose ready queue is not
visible, the load is the writes arriving at each pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.sessions.journal import GATHER_BUSY, GATHER_BUSY_REMOTE, GATHER_PASSES, Journal
from server.sessions.session import SessionLog
from server.stores.memory import MemoryStore
from tests.stores import create_session

TURN_START = ev.TurnStart(turn=1, trigger=ev.TRIGGER_KIND_MESSAGE)


async def new_session(journal: Journal, session_id: str) -> SessionLog:
    await create_session(journal.store, session_id, session_pb2.SessionHeader())
    return SessionLog(session_id, session_pb2.SessionHeader(), journal)


async def passes(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def busy(stop: asyncio.Event) -> None:
    """One of the callbacks that keep a loaded loop's ready queue full."""
    while True:
        await asyncio.sleep(0)  # ready again at every pass: a loop that is never idle
        if stop.is_set():
            return


async def writes_two_passes_apart(journal: Journal) -> tuple[SessionLog, SessionLog]:
    a, b = await new_session(journal, "a"), await new_session(journal, "b")
    a.add(TURN_START)
    await passes(2)
    b.add(TURN_START)
    return a, b


async def test_a_quiet_loop_commits_one_pass_after_the_first_write() -> None:
    journal = Journal(MemoryStore())
    a, b = await writes_two_passes_apart(journal)
    await a.settle()
    await b.settle()
    assert journal.commits == 2  # a's commit had started when b wrote
    assert (a.stored, b.stored) == (1, 1)


async def test_a_loaded_loop_gathers_the_writes_of_a_few_passes_into_one_commit() -> None:
    journal = Journal(MemoryStore())
    stop = asyncio.Event()
    others = [asyncio.ensure_future(busy(stop)) for _ in range(GATHER_BUSY)]
    try:
        await passes(1)  # the busy callbacks are running
        a, b = await writes_two_passes_apart(journal)
        assert (a.stored, b.stored) == (0, 0)  # nothing published before its commit
        await a.settle()
        assert journal.commits == 1  # b's write joined a's commit
        assert (a.stored, b.stored) == (1, 1)
    finally:
        stop.set()
        await asyncio.gather(*others)


async def test_a_loaded_loop_still_commits_within_the_bound() -> None:
    journal = Journal(MemoryStore())
    stop = asyncio.Event()
    others = [asyncio.ensure_future(busy(stop)) for _ in range(GATHER_BUSY)]
    try:
        await passes(1)
        session = await new_session(journal, "a")
        session.add(TURN_START)
        # Started after at most GATHER_PASSES passes and written soon after: the
        # loop never being idle does not hold the commit back for longer.
        await passes(GATHER_PASSES + 3)
        assert (journal.commits, session.stored) == (1, 1)
    finally:
        stop.set()
        await asyncio.gather(*others)


def remote_store() -> MemoryStore:
    """A memory store that says its commits are round trips (as PostgreSQL's are)."""
    store = MemoryStore()
    store.remote = True
    return store


async def test_a_remote_store_gathers_while_any_callback_is_ready() -> None:
    for store, expected in ((MemoryStore(), 2), (remote_store(), 1)):
        journal = Journal(store)
        stop = asyncio.Event()
        others = [asyncio.ensure_future(busy(stop)) for _ in range(GATHER_BUSY_REMOTE)]
        try:
            await passes(1)
            a, b = await writes_two_passes_apart(journal)
            await a.settle()
            await b.settle()
            # One task still ready (a turn computing its next events): b's write joins
            # a's commit when the store is remote, and misses it when it is local.
            assert journal.commits == expected, store.remote
            assert (a.stored, b.stored) == (1, 1)
        finally:
            stop.set()
            await asyncio.gather(*others)


async def test_a_remote_store_still_commits_within_the_bound() -> None:
    journal = Journal(remote_store())
    stop = asyncio.Event()
    others = [asyncio.ensure_future(busy(stop)) for _ in range(GATHER_BUSY_REMOTE)]
    try:
        await passes(1)
        session = await new_session(journal, "a")
        session.add(TURN_START)
        await passes(GATHER_PASSES + 3)
        assert (journal.commits, session.stored) == (1, 1)
    finally:
        stop.set()
        await asyncio.gather(*others)


# -- a loop whose ready queue is not visible (uvloop, the server's default) -------------


def on_uvloop(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `test` on a uvloop loop, as `python -m server` runs the journal."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert not hasattr(runner.get_loop(), "_ready")  # the signal `_gather` falls back from
        runner.run(test())


def test_on_uvloop_a_lone_writer_commits_one_pass_after_its_first() -> None:
    async def test() -> None:
        journal = Journal(MemoryStore())
        session = await new_session(journal, "a")
        session.add(TURN_START)
        await passes(1)
        assert session.stored == 0  # the one more pass: a ready task may still write
        await passes(2)
        assert (journal.commits, session.stored) == (1, 1)

    on_uvloop(test)


def test_on_uvloop_writes_that_keep_arriving_join_one_commit() -> None:
    async def test() -> None:
        journal = Journal(MemoryStore())
        sessions = [await new_session(journal, f"s{i}") for i in range(GATHER_PASSES - 1)]
        for session in sessions:  # another agent writes at each pass: a loaded loop
            session.add(TURN_START)
            await passes(1)
        await sessions[0].settle()
        assert journal.commits == 1
        assert [s.stored for s in sessions] == [1] * len(sessions)

    on_uvloop(test)


def test_on_uvloop_a_commit_starts_within_the_bound_while_writes_keep_arriving() -> None:
    async def test() -> None:
        journal = Journal(MemoryStore())
        sessions = [await new_session(journal, f"s{i}") for i in range(GATHER_PASSES + 3)]
        for session in sessions:
            session.add(TURN_START)
            await passes(1)
        assert sessions[0].stored == 1  # not held back for as long as the writes come
        await sessions[-1].settle()
        assert 1 < journal.commits < len(sessions)

    on_uvloop(test)


def test_on_uvloop_a_remote_store_gathers_a_lone_turn_s_next_events() -> None:
    async def gathered(store: MemoryStore) -> int:
        journal = Journal(store)
        session = await new_session(journal, "a")
        for turn in range(1, 4):  # one session's events, a pass apart
            session.add(ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE))
            await passes(1)
        await session.settle()
        return journal.commits

    async def test() -> None:
        # Remote: each write that can still join saves a round trip. Local: a lone
        # turn's events are not load; the commit starts one pass after the first.
        assert await gathered(remote_store()) == 1
        assert await gathered(MemoryStore()) == 2

    on_uvloop(test)
