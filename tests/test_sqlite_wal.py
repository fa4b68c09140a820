"""The SQLite store checkpoints by WAL pages; a WAL checkpointed whole starts over."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.sessions.session import SessionLog
from server.stores import sqlite as sqlite_store
from server.stores import sqlite_wal
from server.stores.sqlite import SqliteStore
from tests.stores import append_events, create_session

FRAME = 4096 + 24
"""A WAL frame: a page and its header."""


def turn_events(session: SessionLog, turn: int) -> list[ev.SessionEvent]:
    start = len(session.events)
    session.add(ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE))
    for _ in range(8):
        session.add(ev.AssistantChunk(turn=turn, step=1))
    session.add(ev.TurnEnd(turn=turn))
    return session.events[start:]


async def test_a_checkpoint_comes_every_so_many_pages_and_the_wal_then_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_PAGES", 64)
    store = SqliteStore(tmp_path / "agentloop.db")
    wal = tmp_path / "agentloop.db-wal"
    ids = [f"s{i}" for i in range(20)]
    logs = {i: SessionLog(i, session_pb2.SessionHeader()) for i in ids}
    turns = dict.fromkeys(ids, 0)

    async def commit_a_turn(session_id: str) -> None:
        turns[session_id] += 1
        await append_events(store, session_id, turn_events(logs[session_id], turns[session_id]))

    try:
        for session_id in ids:
            await create_session(store, session_id, session_pb2.SessionHeader())
        checkpoints = 0
        for _ in range(40):
            for session_id in ids:
                await commit_a_turn(session_id)
                if store.wal.running is not None:  # let each checkpoint finish (no timing)
                    checkpoints += not store.wal.running.done()
                    await store.wal.running
        written = sum(len(log.events) for log in logs.values())
        assert written == 20 * 40 * 10 and checkpoints >= 10
        # Each commit writes a page or more: 800 commits would leave a WAL of 800+ frames
        # had it grown; starting over after each checkpoint, it holds about 64 pages.
        assert wal.stat().st_size < 200 * FRAME
        for session_id in ids:
            assert (await store.load(session_id)).events == logs[session_id].events
    finally:
        await store.close()
    assert not wal.exists() or wal.stat().st_size == 0  # a clean stop folds it in


async def test_under_nonstop_commits_while_a_reader_streams_the_wal_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Commits never pause for a checkpoint here (the test never waits for one) and a reader
    # reads all along. A checkpoint beside the commits alone never copies the frames that
    # land while it runs, so the WAL would grow by every commit; its last pass, holding
    # the write lock, lets the WAL start over, and a commit that finds it at its cap waits
    # for the checkpoint: the bound holds whatever the threads' timing.
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_PAGES", 64)
    store = SqliteStore(tmp_path / "agentloop.db")
    wal = tmp_path / "agentloop.db-wal"
    ids = [f"s{i}" for i in range(20)]
    logs = {i: SessionLog(i, session_pb2.SessionHeader()) for i in ids}
    writing = True
    reads = 0

    async def stream() -> None:
        nonlocal reads
        while writing:
            for session_id in ids:
                events = await store.read(session_id, 1, 1 << 30)
                assert events == logs[session_id].events[: len(events)]
                reads += 1

    try:
        for session_id in ids:
            await create_session(store, session_id, session_pb2.SessionHeader())
        reader = asyncio.ensure_future(stream())
        largest = 0
        for turn in range(1, 61):
            for session_id in ids:
                await append_events(store, session_id, turn_events(logs[session_id], turn))
                largest = max(largest, wal.stat().st_size)
                await asyncio.sleep(0)  # the reader and the checkpoints' callbacks run
        writing = False
        await reader
        stats = store.wal.stats
        # 1,200 commits of a page or more each: grown, the WAL would hold 1,200+ frames.
        # Bounded: at most the cap (4 x 64 pages, counted high) since it last started over.
        cap = sqlite_store.CAP_CHECKPOINTS * 64
        assert largest <= (cap + 64) * FRAME
        assert stats.folds >= 10 and stats.folds <= stats.checkpoints and reads > 0
        for session_id in ids:
            assert (await store.load(session_id)).events == logs[session_id].events
    finally:
        await store.close()


async def test_a_wal_grown_past_the_size_limit_shrinks_back_when_it_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_PAGES", 16)
    limit = sqlite_store.LIMIT_CHECKPOINTS * 16 * 4096  # journal_size_limit, in bytes
    store = SqliteStore(tmp_path / "agentloop.db")
    wal = tmp_path / "agentloop.db-wal"
    log = SessionLog("s", session_pb2.SessionHeader())
    try:
        await create_session(store, "s", session_pb2.SessionHeader())
        store.wal.pages = 1 << 30  # no checkpoint: the WAL grows (a burst, an older server)
        for turn in range(1, 101):
            await append_events(store, "s", turn_events(log, turn))
        assert wal.stat().st_size > 2 * limit
        store._checkpoint()
        assert store.wal.running is not None
        await store.wal.running
        assert store.wal.stats.folds == 1
        await append_events(store, "s", turn_events(log, 101))  # starts the WAL over
        assert wal.stat().st_size <= limit
        assert (await store.load("s")).events == log.events
    finally:
        await store.close()


@pytest.mark.skipif(not os.path.isdir(sqlite_wal.FDS), reason="no /proc/self/fd here")
async def test_the_syncs_between_passes_find_sqlites_own_descriptors_of_the_files(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "agentloop.db")
    try:
        await create_session(store, "s", session_pb2.SessionHeader())
        store.wal.flush()
        found = {os.readlink(f"{sqlite_wal.FDS}/{fd}") for fd in store.wal._fds}
    finally:
        await store.close()
    db = store.wal.path  # the real path: the descriptors name it
    assert db.endswith("agentloop.db") and found == {db, f"{db}-wal"}
