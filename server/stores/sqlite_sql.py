"""The SQL of the SQLite store: each function is one synchronous transaction or query.

`server.stores.sqlite` decides where these run (the event loop's thread or a worker)
and turns their results into messages. A session's event count and last turn are
read from its events (the primary key makes both a short index walk), so a commit
writes the events and nothing else: no counter row to rewrite on every append.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from agentloop.v1 import session_event_pb2 as ev
from server.core.errors import AlreadyExists, SessionNotFound
from server.stores import (
    FIRST_SEQ,
    SessionWrites,
    StoreConflict,
    check_fence,
    check_follows,
    fork_boundary,
)
from server.stores.kinds import KIND_NAMES, KIND_NUMBERS, TURN_END, TURN_START


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any failure."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@dataclass(frozen=True)
class SessionRows:
    """One session's writes of a commit, as rows (serialized on the caller's thread)."""

    session_id: str
    header: bytes | None
    create_ns: int
    driver: str
    options: bytes | None
    first_seq: int
    events: list[tuple[str, int, int, bytes]]
    puts: list[tuple[str, int, str, bytes]]
    takes: list[tuple[str, int]]
    requests: list[tuple[str, str, str, bytes]]
    fence: int
    size: int
    """Bytes of events and inbox entries."""

    @staticmethod
    def of(session_id: str, writes: SessionWrites) -> SessionRows:
        """The rows of `writes`; raises `StoreConflict` if its events have a gap."""
        events = writes.events
        first = events[0].seq if events else 0
        if events and events[-1].seq != first + len(events) - 1:
            check_follows(session_id, first - FIRST_SEQ, events)  # a gap: raise, naming it
        numbers, encode = KIND_NUMBERS, writes.encode
        rows = [
            (session_id, e.seq, numbers[e.WhichOneof("payload")], encode(e))  # type: ignore[index]
            for e in events
        ]
        puts = [
            (session_id, i.entry_id, i.kind, i.message.SerializeToString())
            for i in writes.inbox_put
        ]
        header = writes.create
        return SessionRows(
            session_id,
            header.SerializeToString() if header is not None else None,
            header.create_time.ToNanoseconds() if header is not None else 0,
            writes.driver,
            writes.options.SerializeToString() if writes.options is not None else None,
            first,
            rows,
            puts,
            [(session_id, entry_id) for entry_id in writes.inbox_take],
            [(r.agent_id, r.request_id, r.method, r.response) for r in writes.requests],
            writes.fence,
            sum(len(r[3]) for r in rows) + sum(len(p[3]) for p in puts),
        )


def event_count(db: sqlite3.Connection, session_id: str) -> int:
    """The number of stored events of a session: its last seq, as seqs start at 1."""
    row = db.execute("SELECT MAX(seq) FROM events WHERE session_id = ?", (session_id,)).fetchone()
    return 0 if row[0] is None else int(row[0]) - FIRST_SEQ + 1


def last_turn(db: sqlite3.Connection, session_id: str) -> int:
    """The highest turn number of a session: its last `turn_start` (turns only grow)."""
    row = db.execute(
        "SELECT event FROM events WHERE session_id = ? AND kind = ? ORDER BY seq DESC LIMIT 1",
        (session_id, TURN_START),
    ).fetchone()
    return 0 if row is None else ev.SessionEvent.FromString(row[0]).turn_start.turn


FENCE_AND_LAST = (
    "SELECT fence, (SELECT MAX(seq) FROM events WHERE session_id = ?1)"
    " FROM sessions WHERE session_id = ?1"
)
"""A session's claim token and last seq; no row when the session is unknown."""


def write_commit(db: sqlite3.Connection, sessions: list[SessionRows]) -> None:
    """One transaction. The stored event count is the fence against a second writer."""
    with transaction(db):
        for s in sessions:
            if s.header is not None:
                try:
                    db.execute(
                        "INSERT INTO sessions (session_id, header, create_ns) VALUES (?, ?, ?)",
                        (s.session_id, s.header, s.create_ns),
                    )
                except sqlite3.IntegrityError:
                    raise AlreadyExists(f'session "{s.session_id}" already exists') from None
            if s.fence and s.events:  # the common case: both checks in one statement
                row = db.execute(FENCE_AND_LAST, (s.session_id,)).fetchone()
                if row is None:
                    raise SessionNotFound(s.session_id)
                check_fence(s.session_id, row[0], s.fence)
                stored = 0 if row[1] is None else int(row[1]) - FIRST_SEQ + 1
                if stored + FIRST_SEQ != s.first_seq:
                    _refuse(db, s.session_id, s.first_seq, stored)
                db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", s.events)
            elif s.fence:
                row = db.execute(
                    "SELECT fence FROM sessions WHERE session_id = ?", (s.session_id,)
                ).fetchone()
                if row is None:
                    raise SessionNotFound(s.session_id)
                check_fence(s.session_id, row[0], s.fence)
            elif s.events:
                stored = event_count(db, s.session_id)
                if stored + FIRST_SEQ != s.first_seq or (stored == 0 and s.header is None):
                    _refuse(db, s.session_id, s.first_seq, stored)
                db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", s.events)
            if s.driver:
                moved = db.execute(
                    "UPDATE sessions SET driver = ? WHERE session_id = ?",
                    (s.driver, s.session_id),
                ).rowcount
                if moved != 1:
                    raise SessionNotFound(s.session_id)
            if s.options is not None:
                db.execute(
                    "UPDATE sessions SET options = ? WHERE session_id = ?",
                    (s.options, s.session_id),
                )
            if s.puts:
                db.executemany("INSERT INTO inbox VALUES (?, ?, ?, ?)", s.puts)
            if s.takes:
                db.executemany("DELETE FROM inbox WHERE session_id = ? AND entry_id = ?", s.takes)
            if s.requests:
                db.executemany("INSERT OR IGNORE INTO requests VALUES (?, ?, ?, ?)", s.requests)


def _refuse(db: sqlite3.Connection, session_id: str, first_seq: int, stored: int) -> None:
    """Raise why an append does not follow: no such session, or another writer.

    Returns when it does follow after all (the first events of an existing session).
    """
    exists = db.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    if exists is None:
        raise SessionNotFound(session_id)
    if stored + FIRST_SEQ == first_seq:
        return
    raise StoreConflict(
        f'session "{session_id}": event {first_seq} does not follow the {stored} stored'
    )


def fork_copy(
    db: sqlite3.Connection,
    source_id: str,
    boundary_seq: int | None,
    new_id: str,
    header_of: Callable[[int], bytes],
    create_ns: int,
) -> int:
    """Create `new_id` with the source's events up to a `turn_end`; the seed length.

    One transaction: the header (`header_of(seed length)`), the events and the options
    land together, so a crash leaves the fork absent or whole.
    """
    with transaction(db):
        if (
            db.execute("SELECT 1 FROM sessions WHERE session_id = ?", (source_id,)).fetchone()
            is None
        ):
            raise SessionNotFound(source_id)
        kind_at = None
        if boundary_seq is not None:
            row = db.execute(
                "SELECT kind FROM events WHERE session_id = ? AND seq = ?",
                (source_id, boundary_seq),
            ).fetchone()
            kind_at = KIND_NAMES.get(row[0], "unknown") if row is not None else None
        last = db.execute(
            "SELECT MAX(seq) FROM events WHERE session_id = ? AND kind = ?",
            (source_id, TURN_END),
        ).fetchone()[0]
        count = event_count(db, source_id)
        boundary = fork_boundary(source_id, boundary_seq, count, kind_at, last)
        seed = boundary - FIRST_SEQ + 1
        try:
            db.execute(
                "INSERT INTO sessions (session_id, header, create_ns, options)"
                " SELECT ?, ?, ?, options FROM sessions WHERE session_id = ?",
                (new_id, header_of(seed), create_ns, source_id),
            )
        except sqlite3.IntegrityError:
            raise AlreadyExists(f'session "{new_id}" already exists') from None
        db.execute(
            "INSERT INTO events SELECT ?, seq, kind, event FROM events"
            " WHERE session_id = ? AND seq <= ?",
            (new_id, source_id, boundary),
        )
    return seed


def adopt_move(
    db: sqlite3.Connection, agent_id: str, session_id: str
) -> list[tuple[int, str, bytes]]:
    """Move the inbox of the other sessions driven by `agent_id`; the moved entries."""
    with transaction(db):
        rows = db.execute(
            "SELECT inbox.session_id, entry_id, kind, message FROM inbox"
            " JOIN sessions USING (session_id)"
            " WHERE sessions.driver = ? AND inbox.session_id != ?"
            " ORDER BY sessions.create_ns, inbox.session_id, entry_id",
            (agent_id, session_id),
        ).fetchall()
        start = db.execute(
            "SELECT COALESCE(MAX(entry_id), 0) FROM inbox WHERE session_id = ?", (session_id,)
        ).fetchone()[0]
        moved = []
        for offset, (source, entry_id, kind, message) in enumerate(rows, start=1):
            db.execute(
                "DELETE FROM inbox WHERE session_id = ? AND entry_id = ?", (source, entry_id)
            )
            db.execute(
                "INSERT INTO inbox VALUES (?, ?, ?, ?)",
                (session_id, start + offset, kind, message),
            )
            moved.append((start + offset, kind, message))
    return moved


def claim(db: sqlite3.Connection, session_id: str) -> int:
    """Bump the session's claim token; the new one."""
    with transaction(db):
        row = db.execute(
            "UPDATE sessions SET fence = fence + 1 WHERE session_id = ? RETURNING fence",
            (session_id,),
        ).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    return int(row[0])


def summary_row(db: sqlite3.Connection, session_id: str) -> tuple[bytes, int, int, int]:
    """Header bytes, event count, last turn and inbox size of a session."""
    row = db.execute("SELECT header FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    pending = db.execute(
        "SELECT COUNT(*) FROM inbox WHERE session_id = ?", (session_id,)
    ).fetchone()[0]
    return row[0], event_count(db, session_id), last_turn(db, session_id), pending
