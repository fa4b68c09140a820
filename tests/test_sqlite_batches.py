"""Format 4 of the SQLite store: a commit's events of a session in one row.

Reads, counts and forks see single events wherever a row's run starts or ends; a file
of format 3 (one event per row) is migrated in place and reads as before.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.kernel.errors import InvalidArgument, SessionDamaged
from server.sessions.session import SessionLog
from server.stores.kinds import KIND_NUMBERS
from server.stores.sqlite import SqliteStore
from server.stores.sqlite_batches import pack, unpack
from server.stores.sqlite_schema import FORMAT_VERSION
from tests.stores import append_events, create_session


def two_turns() -> list[ev.SessionEvent]:
    """Two turns of 5 events each: turn_start, step_start, a chunk, step_end, turn_end."""
    session = SessionLog("s", session_pb2.SessionHeader())
    for turn in (1, 2):
        session.add(ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE))
        session.add(ev.StepStart(turn=turn, step=1))
        session.add(ev.AssistantChunk(turn=turn, step=1))
        session.add(ev.StepEnd(turn=turn, step=1))
        session.add(ev.TurnEnd(turn=turn))
    return session.events


@pytest.fixture
async def store(tmp_path: Path):
    s = SqliteStore(tmp_path / "agentloop.db")
    yield s
    await s.close()


def test_pack_and_unpack_round_trip_and_refuse_a_bad_row() -> None:
    raws = [e.SerializeToString() for e in two_turns()] + [b"x" * 300, b""]
    assert unpack(pack(raws), len(raws)) == raws
    assert pack(raws[:1]) == raws[0] and unpack(raws[0], 1) == raws[:1]  # one event: bare
    packed = pack(raws)
    with pytest.raises(DecodeError):
        unpack(packed, len(raws) + 1)  # fewer events than the row says
    with pytest.raises(DecodeError):
        unpack(packed[:-1], len(raws))  # ends inside an event
    with pytest.raises(DecodeError):
        unpack(b"\xff" + packed[1:], len(raws))  # not a run


async def test_a_commit_is_one_row_and_reads_cut_anywhere(
    store: SqliteStore, tmp_path: Path
) -> None:
    events = two_turns()
    await create_session(store, "s", session_pb2.SessionHeader())
    await append_events(store, "s", events[:7])  # a row of 7, ending inside turn 2
    await append_events(store, "s", events[7:])  # a row of 3
    with sqlite3.connect(tmp_path / "agentloop.db") as db:
        rows = db.execute("SELECT seq, count FROM events WHERE session_id = 's'").fetchall()
    assert rows == [(1, 7), (8, 3)]
    assert (await store.load("s")).events == events
    for start in range(0, 12):
        for end in range(start, 13):
            read = await store.read("s", start, end)
            assert read == events[max(start, 1) - 1 : max(end - 1, 0)], (start, end)
    summary = await store.summary("s")
    assert (summary.event_count, summary.turn_count) == (10, 2)


async def test_a_fork_cuts_a_row_at_its_boundary(store: SqliteStore) -> None:
    events = two_turns()
    await create_session(store, "s", session_pb2.SessionHeader())
    await append_events(store, "s", events)  # one row of 10: turn_ends at seqs 5 and 10
    assert await store.fork("s", 5, "first", session_pb2.SessionHeader()) == 5
    assert (await store.load("first")).events == events[:5]
    assert await store.fork("s", None, "whole", session_pb2.SessionHeader()) == 10
    assert (await store.load("whole")).events == events
    with pytest.raises(InvalidArgument, match="event 4 is a step_end, not a turn_end"):
        await store.fork("s", 4, "nope", session_pb2.SessionHeader())
    with pytest.raises(InvalidArgument, match="out of range"):
        await store.fork("s", 11, "nope", session_pb2.SessionHeader())
    await append_events(store, "first", events[5:])  # the fork goes on from its boundary
    assert (await store.summary("first")).turn_count == 2


async def test_a_damaged_row_of_several_events_damages_its_session_only(
    store: SqliteStore, tmp_path: Path
) -> None:
    events = two_turns()
    for name in ("good", "bad"):
        await create_session(store, name, session_pb2.SessionHeader())
        await append_events(store, name, events)
    with sqlite3.connect(tmp_path / "agentloop.db") as db:
        db.execute("UPDATE events SET count = 11 WHERE session_id = 'bad'")
    for read in (store.load("bad"), store.read("bad", 1, 3), store.summary("bad")):
        with pytest.raises(SessionDamaged, match='session "bad" is damaged'):
            await read
    with pytest.raises(SessionDamaged, match='session "bad" is damaged'):
        await store.fork("bad", None, "copy", session_pb2.SessionHeader())
    assert (await store.load("good")).events == events


FORMAT_3 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    header BLOB NOT NULL,
    create_ns INTEGER NOT NULL DEFAULT 0,
    driver TEXT NOT NULL DEFAULT '',
    fence INTEGER NOT NULL DEFAULT 0,
    options BLOB
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
CREATE INDEX sessions_by_driver ON sessions (driver);
INSERT INTO meta VALUES ('format_version', '3');
"""


async def test_a_format_3_file_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "agentloop.db"
    events = two_turns()
    header = session_pb2.SessionHeader(cwd="/old")
    with sqlite3.connect(path) as db:  # as format 3 wrote it: a row per event
        db.executescript(FORMAT_3)
        db.execute(
            "INSERT INTO sessions (session_id, header, driver, fence) VALUES ('old', ?, 'a', 2)",
            (header.SerializeToString(),),
        )
        db.executemany(
            "INSERT INTO events VALUES ('old', ?, ?, ?)",
            [(e.seq, KIND_NUMBERS[e.WhichOneof("payload") or ""], e.SerializeToString())
             for e in events[:7]],
        )  # fmt: skip
    store = SqliteStore(path)
    try:
        await store.open()
        loaded = await store.load("old")
        assert loaded.header == header and loaded.events == events[:7]
        assert await store.read("old", 3, 6) == events[2:5]
        summary = await store.summary("old")
        assert (summary.event_count, summary.turn_count) == (7, 2)  # kinds known
        assert await store.fork("old", None, "new", session_pb2.SessionHeader()) == 5
        assert await store.driven_by("a") == ["old"]
        assert await store.claim("old") == 3
        await append_events(store, "old", events[7:])  # a row of 3 after 7 rows of 1
        assert (await store.load("old")).events == events
        assert (await store.summary("old")).event_count == 10
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
        rows = db.execute("SELECT seq, count FROM events WHERE session_id = 'old'").fetchall()
    assert version == (FORMAT_VERSION,) == ("7",)
    assert rows == [(seq, 1) for seq in range(1, 8)] + [(8, 3)]


def test_every_payload_kind_fits_the_kinds_bit_mask() -> None:
    # A row's `kinds` is a signed 64-bit SQLite integer with bit `1 << kind` per kind: a
    # payload field numbered 63 or more would overflow it, so the contract must not add one
    # without a new layout.
    assert max(KIND_NUMBERS.values()) < 63
