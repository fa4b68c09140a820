"""The SQLite store: round trips, counts, listing, damage reported per session."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.kernel.errors import AlreadyExists, NotFound, SessionDamaged
from server.sessions.session import SessionLog
from server.stores import StoreConflict
from server.stores.sqlite import SqliteStore
from server.stores.sqlite_schema import FORMAT_VERSION
from tests.stores import append_events, create_session


def sample_events(turns: int) -> list[ev.SessionEvent]:
    session = SessionLog("s", session_pb2.SessionHeader())
    for turn in range(1, turns + 1):
        session.add(ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE))
        session.add(ev.TurnEnd(turn=turn))
    return session.events


@pytest.fixture
async def store(tmp_path: Path):
    s = SqliteStore(tmp_path / "data" / "agentloop.db")
    yield s
    await s.close()


async def test_round_trip_and_counts(store: SqliteStore) -> None:
    header = session_pb2.SessionHeader(cwd="/w")
    await create_session(store, "s1", header)
    events = sample_events(3)
    await append_events(store, "s1", events[:2])
    await append_events(store, "s1", events[2:])
    loaded_session = await store.load("s1")
    loaded_header, loaded = loaded_session.header, loaded_session.events
    assert loaded_header == header and loaded == events
    summary = await store.summary("s1")
    assert (summary.event_count, summary.turn_count) == (6, 3)
    assert await store.list_ids() == ["s1"]
    assert await store.exists("s1") and not await store.exists("nope")


async def test_duplicates_gaps_and_unknown_sessions(store: SqliteStore) -> None:
    await create_session(store, "s1", session_pb2.SessionHeader())
    with pytest.raises(AlreadyExists):
        await create_session(store, "s1", session_pb2.SessionHeader())
    with pytest.raises(NotFound):
        await store.load("nope")
    events = sample_events(2)
    with pytest.raises(StoreConflict, match="does not follow"):
        await append_events(store, "s1", events[1:])
    stored = (await store.load("s1")).events
    assert stored == []  # the rejected append wrote nothing


async def test_a_corrupt_row_damages_only_its_session(store: SqliteStore, tmp_path: Path) -> None:
    for name in ("good", "bad"):
        await create_session(store, name, session_pb2.SessionHeader())
        await append_events(store, name, sample_events(1))
    await store.close()
    with sqlite3.connect(tmp_path / "data" / "agentloop.db") as db:
        db.execute("UPDATE events SET event = X'FFFFFFFF' WHERE session_id = 'bad' AND seq = 1")
    reopened = SqliteStore(tmp_path / "data" / "agentloop.db")
    with pytest.raises(SessionDamaged, match='session "bad" is damaged'):
        await reopened.load("bad")
    good = (await reopened.load("good")).events
    assert len(good) == 2
    await reopened.close()


async def test_a_file_that_is_not_a_database_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "agentloop.db"
    path.write_bytes(b"this is not a database" * 100)
    store = SqliteStore(path)
    with pytest.raises(SessionDamaged, match="session store is damaged"):
        await store.open()
    with pytest.raises(SessionDamaged):
        await store.load("any")
    await store.close()


async def test_an_unknown_format_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agentloop.db"
    store = SqliteStore(path)
    await store.open()
    await store.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'format_version'")
    again = SqliteStore(path)
    with pytest.raises(SessionDamaged, match="format version 99"):
        await again.open()
    await again.close()


FORMAT_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    header BLOB NOT NULL,
    event_count INTEGER NOT NULL DEFAULT 0,
    turn_count INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
INSERT INTO meta VALUES ('format_version', '1');
"""


def zero_based(events: list[ev.SessionEvent]) -> list[ev.SessionEvent]:
    """The events as formats 1 and 2 stored them: numbered from 0."""
    old = []
    for event in events:
        copy = ev.SessionEvent()
        copy.CopyFrom(event)
        copy.seq -= 1
        del copy.source_event_seqs[:]
        copy.source_event_seqs.extend(s - 1 for s in event.source_event_seqs)
        old.append(copy)
    return old


async def test_a_format_1_file_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "agentloop.db"
    events = sample_events(2)
    header = session_pb2.SessionHeader(cwd="/old")
    with sqlite3.connect(path) as db:
        db.executescript(FORMAT_1)
        db.execute("INSERT INTO sessions VALUES ('old', ?, ?, 2)", (header.SerializeToString(), 4))
        db.executemany(
            "INSERT INTO events VALUES ('old', ?, ?)",
            [(e.seq, e.SerializeToString()) for e in zero_based(events)],
        )
    store = SqliteStore(path)
    await store.open()
    loaded = await store.load("old")
    assert loaded.header == header and loaded.events == events
    summary = await store.summary("old")
    assert (summary.event_count, summary.turn_count) == (4, 2)
    assert await store.fork("old", None, "new", session_pb2.SessionHeader()) == 4  # kinds known
    await append_events(store, "old", sample_events(3)[4:])
    assert len((await store.load("old")).events) == 6
    await store.close()
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
    assert version == (FORMAT_VERSION,)


FORMAT_2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    header BLOB NOT NULL,
    create_ns INTEGER NOT NULL DEFAULT 0,
    driver TEXT NOT NULL DEFAULT ''
);
CREATE TABLE events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE inbox (
    session_id TEXT NOT NULL,
    entry_id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    message BLOB NOT NULL,
    PRIMARY KEY (session_id, entry_id)
) WITHOUT ROWID;
CREATE TABLE requests (
    agent_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    method TEXT NOT NULL,
    response BLOB NOT NULL,
    PRIMARY KEY (agent_id, request_id)
) WITHOUT ROWID;
INSERT INTO meta VALUES ('format_version', '2');
"""


async def test_a_format_2_file_is_renumbered_from_1_in_place(tmp_path: Path) -> None:
    path = tmp_path / "agentloop.db"
    session = SessionLog("s", session_pb2.SessionHeader())
    session.add(ev.TurnStart(turn=1, trigger=ev.TRIGGER_KIND_MESSAGE))
    session.add(ev.StepStart(turn=1, step=1))
    chunk = session.add(ev.AssistantChunk())
    session.add(ev.AssistantMessage(), source_event_seqs=[chunk.seq])
    session.add(ev.StepEnd(turn=1, step=1))
    session.add(ev.TurnEnd(turn=1))
    events = session.events
    with sqlite3.connect(path) as db:
        db.executescript(FORMAT_2)
        db.execute("INSERT INTO sessions (session_id, header) VALUES ('old', ?)", (b"",))
        db.executemany(
            "INSERT INTO events VALUES ('old', ?, 0, ?)",
            [(e.seq, e.SerializeToString()) for e in zero_based(events)],
        )
    store = SqliteStore(path)
    await store.open()
    loaded = await store.load("old")
    assert loaded.events == events and loaded.options is None
    assert list(loaded.events[3].source_event_seqs) == [3]
    assert (await store.summary("old")).event_count == 6
    await store.close()


async def test_a_format_6_file_gains_each_sessions_event_count(tmp_path: Path) -> None:
    path = tmp_path / "agentloop.db"
    events = sample_events(3)
    store = SqliteStore(path)
    await create_session(store, "two", session_pb2.SessionHeader())
    await append_events(store, "two", events[:2])
    await append_events(store, "two", events[2:4])
    await create_session(store, "empty", session_pb2.SessionHeader())
    await store.close()
    with sqlite3.connect(path) as db:  # as format 6 stored it: the count only in the events
        db.execute("ALTER TABLE sessions DROP COLUMN event_count")
        db.execute("UPDATE meta SET value = '6' WHERE key = 'format_version'")
    again = SqliteStore(path)
    assert (await again.summary("two")).event_count == 4
    assert (await again.summary("empty")).event_count == 0
    assert (await again.load("two")).events == events[:4]
    await append_events(again, "two", events[4:])  # appends follow the count
    await again.close()
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
        db.execute("DELETE FROM events WHERE session_id = 'two' AND seq = 5")
    assert version == (FORMAT_VERSION,) == ("7",)
    cut = SqliteStore(path)
    with pytest.raises(SessionDamaged, match="its last 2 events are missing"):
        await cut.load("two")
    await cut.close()
