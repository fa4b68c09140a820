"""SQLite checkpoints run on their own thread and connection: reads never queue behind one.

A checkpoint's last pass (RESTART, holding the store's write lock) waits for every read
that still reads from the WAL. Here a connection of the test's own holds such a read
open, so the checkpoint stays in that pass until the test ends the read: what the
store does meanwhile is seen without a stopwatch.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from agentloop.v1 import session_pb2
from server.sessions.session import SessionLog
from server.stores import sqlite_wal
from server.stores.sqlite import SqliteStore
from tests.stores import append_events, create_session
from tests.test_sqlite_wal import FRAME, turn_events

IDS = [f"s{i}" for i in range(4)]
PROC = os.path.isdir(sqlite_wal.FDS)


async def filled(path: Path) -> tuple[SqliteStore, dict[str, SessionLog]]:
    """A store whose WAL holds some hundred frames (no checkpoint ran yet)."""
    store = SqliteStore(path)
    store.wal.pages = 1 << 30  # the test starts the checkpoint itself
    logs = {i: SessionLog(i, session_pb2.SessionHeader()) for i in IDS}
    for session_id in IDS:
        await create_session(store, session_id, session_pb2.SessionHeader())
    for turn in range(1, 21):
        for session_id in IDS:
            await append_events(store, session_id, turn_events(logs[session_id], turn))
    assert (path.parent / f"{path.name}-wal").stat().st_size > 50 * FRAME
    return store, logs


def restarts(path: Path) -> int:
    """The WAL header's checkpoint sequence: one more each time the WAL starts over."""
    with open(f"{path}-wal", "rb") as wal:
        return int.from_bytes(wal.read(16)[12:16], "big")


def hold_a_read_open(path: Path) -> sqlite3.Connection:
    """Another connection in a read at the WAL's last frame: every frame can still be
    copied, but the WAL cannot start over until this read ends."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN")
    other.execute("SELECT COUNT(*) FROM events").fetchone()
    return other


async def checkpoint_in_its_last_pass(store: SqliteStore) -> asyncio.Future[None]:
    """Start a checkpoint and wait until its last pass holds the write lock."""

    # The last pass waits for the open read `READ_WAIT_MS` at most (its connection's busy
    # timeout): here, as long as the test takes.
    def patient(db: sqlite3.Connection) -> None:
        db.execute("PRAGMA busy_timeout=600000")

    await store._guarded("", store._checkpointer, store._on_checkpointer, patient)
    store._checkpoint()
    running = store.wal.running
    assert running is not None
    while not store.wal.holding:
        assert not running.done(), "the checkpoint ended before its last pass"
        await asyncio.sleep(0.001)
    return running


async def test_reads_complete_while_a_checkpoint_runs_and_commits_wait_for_its_last_pass(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agentloop.db"
    store, logs = await filled(db)
    before = restarts(db)
    other = hold_a_read_open(db)
    try:
        running = await checkpoint_in_its_last_pass(store)
        # Reads go on, on the reader's thread, while the checkpoint holds the write lock.
        for session_id in IDS:
            assert await store.read(session_id, 1, 1 << 30) == logs[session_id].events
        summary = await store.summary("s0")
        assert summary.event_count == len(logs["s0"].events) and summary.turn_count == 20
        assert store.wal.holding and not running.done()
        # A commit waits for the last pass (off the loop) and is written once it lets go.
        committing = asyncio.ensure_future(append_events(store, "s0", turn_events(logs["s0"], 21)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not committing.done() and store.wal.holding
        other.execute("COMMIT")  # the read ends: the last pass copies the rest and lets go
        await running
        await committing
        assert store.wal.stats.folds == 1 and store.wal.stats.checkpoints == 1
        # The WAL started over: the commit after the checkpoint wrote a new header.
        assert restarts(db) == before + 1
        for session_id in IDS:
            assert (await store.load(session_id)).events == logs[session_id].events
    finally:
        other.close()
        await store.close()


async def test_a_read_that_stays_open_costs_a_fold_not_a_hold_of_the_commits_for_ever(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agentloop.db"
    store, logs = await filled(db)
    other = hold_a_read_open(db)  # never ends while the checkpoint runs
    try:
        store._checkpoint()
        assert store.wal.running is not None
        await store.wal.running  # its last pass gave up waiting for the read
        stats = store.wal.stats
        assert stats.checkpoints == 1 and stats.longest_hold > 0 and stats.folds == 0
        await append_events(store, "s0", turn_events(logs["s0"], 21))
        assert (await store.load("s0")).events == logs["s0"].events
    finally:
        other.close()
        await store.close()


def descriptors_of(path: Path) -> list[int]:
    """This process's open descriptors of the database file and its WAL."""
    names = {os.path.realpath(path), os.path.realpath(path) + "-wal"}
    found = []
    for name in os.listdir(sqlite_wal.FDS):
        try:
            if os.readlink(f"{sqlite_wal.FDS}/{name}") in names:
                found.append(int(name))
        except OSError:
            continue
    return found


async def test_a_clean_close_waits_for_a_checkpoint_in_flight_then_closes_its_connection(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agentloop.db"
    store, logs = await filled(db)
    other = hold_a_read_open(db)
    try:
        running = await checkpoint_in_its_last_pass(store)
        closing = asyncio.ensure_future(store.close())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not closing.done() and not running.done()  # the close waits for it
        other.execute("COMMIT")
        await closing
        assert running.done() and store.wal.stats.folds == 1
    finally:
        other.close()
        await store.close()  # (a second close does nothing)
    assert store._checkpoint_db is None and store._read_db is None and store._write_db is None
    threads = [t.name for t in threading.enumerate()]
    assert not [name for name in threads if name.startswith("sqlite-checkpoint")]
    if PROC:
        assert descriptors_of(db) == []  # every connection of the store is closed
    wal = tmp_path / "agentloop.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # the close folded it in
    again = SqliteStore(db)
    try:
        for session_id in IDS:
            assert (await again.load(session_id)).events == logs[session_id].events
    finally:
        await again.close()


@pytest.mark.skipif(not PROC, reason="no /proc/self/fd here")
async def test_with_all_three_connections_open_the_syncs_find_one_descriptor_per_file(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agentloop.db"
    store, _ = await filled(db)
    try:
        await store.read("s0", 1, 2)  # the reader's connection
        store._checkpoint()  # the checkpoint's connection
        assert store.wal.running is not None
        await store.wal.running
        assert store._read_db is not None and store._checkpoint_db is not None
        sqlites = descriptors_of(db)
        before = set(os.listdir(sqlite_wal.FDS))
        store.wal.flush()
        assert set(os.listdir(sqlite_wal.FDS)) == before  # it opened nothing
        found = list(store.wal._fds)
        names = {os.readlink(f"{sqlite_wal.FDS}/{fd}") for fd in found}
        files = {os.stat(f"{sqlite_wal.FDS}/{fd}").st_ino for fd in found}
        real = store.wal.path  # the real path: the descriptors name it
        inodes = {os.stat(real).st_ino, os.stat(f"{real}-wal").st_ino}
    finally:
        await store.close()
    # Each connection has its own descriptor of each file; one of each file is synced.
    assert len(sqlites) == 6 and len(found) == 2 and set(found) <= set(sqlites)
    assert names == {real, f"{real}-wal"}
    assert files == inodes
