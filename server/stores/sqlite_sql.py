"""The SQL of the SQLite store: each function is one synchronous transaction or query.

`server.stores.sqlite` decides where these run (the event loop's thread or a worker)
and turns their results into messages. A session's last turn is read from its events
(the primary key makes it a short index walk). Its event count is kept in its
`sessions` row: an append moves it in the statement that checks the claim and that
the events follow (one statement, the fence), and a load compares the log with it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import AlreadyExists, SessionDamaged, SessionNotFound
from server.stores import (
    FIRST_SEQ,
    SessionWrites,
    StoreConflict,
    check_fence,
    check_follows,
    fork_boundary,
)
from server.stores.kinds import KIND_NAMES, KIND_NUMBERS, TURN_END, TURN_START
from server.stores.sqlite_batches import kinds_of, pack, unpack


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
    events: list[tuple[str, int, int, bytes, int, int]]
    """The row of the commit's events: session, first seq, its kind, bytes, count, kinds."""
    puts: list[tuple[str, int, str, bytes]]
    takes: list[tuple[str, int]]
    requests: list[tuple[str, str, str, bytes, str, int]]
    """Request records: agent, request id, method, answer, the session, when (ns)."""
    fence: int
    size: int
    """Bytes of events and inbox entries."""

    @staticmethod
    def of(session_id: str, writes: SessionWrites) -> SessionRows:
        """The rows of `writes`; raises `StoreConflict` if its events have a gap.

        The session's events are one row (`sqlite_batches`): the run from `first_seq`.
        """
        events = writes.events
        first = events[0].seq if events else 0
        if events and events[-1].seq != first + len(events) - 1:
            check_follows(session_id, first - FIRST_SEQ, events)  # a gap: raise, naming it
        rows = []
        size = 0
        if events:
            numbers, encode = KIND_NUMBERS, writes.encode
            kinds = [numbers[e.WhichOneof("payload")] for e in events]  # type: ignore[index]
            blob = pack([encode(e) for e in events])
            rows.append((session_id, first, kinds[0], blob, len(events), kinds_of(kinds)))
            size = len(blob)
        puts = [
            (session_id, i.entry_id, i.kind, i.message.SerializeToString())
            for i in writes.inbox_put
        ]
        header = writes.create
        now = time.time_ns() if writes.requests else 0
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
            [
                (r.agent_id, r.request_id, r.method, r.response, session_id, r.stored_ns or now)
                for r in writes.requests
            ],
            writes.fence,
            size + sum(len(p[3]) for p in puts),
        )


INSERT_ROW = "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)"

INSERT_REQUEST = "INSERT OR IGNORE INTO requests VALUES (?, ?, ?, ?, ?, ?)"


def event_count(db: sqlite3.Connection, session_id: str) -> int:
    """The number of events the session's row records (0 for an unknown session)."""
    row = db.execute(
        "SELECT event_count FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    return 0 if row is None else int(row[0])


def last_of_kind(
    db: sqlite3.Connection, session_id: str, kind: int, at_most: int | None = None
) -> ev.SessionEvent | None:
    """The session's last event of payload `kind` (with seq <= `at_most`), if any."""
    sql = "SELECT seq, count, event FROM events WHERE session_id = ? AND kinds & ?"
    args: tuple[object, ...] = (session_id, 1 << kind)
    if at_most is not None:
        sql += " AND seq <= ?"
        args += (at_most,)
    for seq, count, blob in db.execute(sql + " ORDER BY seq DESC", args):
        raws = unpack(blob, count)
        for offset in range(len(raws) - 1, -1, -1):
            if at_most is not None and seq + offset > at_most:
                continue
            event = ev.SessionEvent.FromString(raws[offset])
            if event.WhichOneof("payload") == KIND_NAMES.get(kind):
                return event
    return None


def event_at(db: sqlite3.Connection, session_id: str, seq: int) -> ev.SessionEvent | None:
    """The stored event `seq` of a session, if any."""
    row = db.execute(
        "SELECT seq, count, event FROM events WHERE session_id = ? AND seq <= ?"
        " ORDER BY seq DESC LIMIT 1",
        (session_id, seq),
    ).fetchone()
    if row is None or not row[0] <= seq < row[0] + row[1]:
        return None
    return ev.SessionEvent.FromString(unpack(row[2], row[1])[seq - row[0]])


def event_rows(
    db: sqlite3.Connection, session_id: str, start: int, end: int | None = None
) -> list[tuple[int, bytes]]:
    """(seq, bytes) of the stored events of a session with `start <= seq < end`."""
    sql = (
        "SELECT seq, count, event FROM events WHERE session_id = ?1 AND seq >= COALESCE("
        "(SELECT seq FROM events WHERE session_id = ?1 AND seq <= ?2 ORDER BY seq DESC LIMIT 1),"
        " ?2)"
    )
    args: tuple[object, ...] = (session_id, start)
    if end is not None:
        sql += " AND seq < ?3"
        args += (end,)
    out = []
    for seq, count, blob in db.execute(sql + " ORDER BY seq", args):
        for offset, raw in enumerate(unpack(blob, count)):
            if start <= seq + offset and (end is None or seq + offset < end):
                out.append((seq + offset, raw))
    return out


def last_turn(db: sqlite3.Connection, session_id: str) -> int:
    """The highest turn number of a session: its last `turn_start` (turns only grow)."""
    event = last_of_kind(db, session_id, TURN_START)
    return 0 if event is None else event.turn_start.turn


MOVE_COUNT = (
    "UPDATE sessions SET event_count = ?1 + ?2 WHERE session_id = ?3 AND event_count = ?1"
    " AND (?4 = 0 OR fence = ?4)"
)
"""An append's fence: the count moves from the stored one the events follow (?1) by
their number (?2), where the writer's claim (?4, 0 unfenced) is the stored one."""


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
            if s.events:  # both checks and the new count in one statement
                follows = s.first_seq - FIRST_SEQ
                added = s.events[0][4]
                moved = db.execute(MOVE_COUNT, (follows, added, s.session_id, s.fence)).rowcount
                if moved != 1:
                    _refuse(db, s.session_id, s.first_seq, s.fence)
                db.executemany(INSERT_ROW, s.events)
            elif s.fence:
                row = db.execute(
                    "SELECT fence FROM sessions WHERE session_id = ?", (s.session_id,)
                ).fetchone()
                if row is None:
                    raise SessionNotFound(s.session_id)
                check_fence(s.session_id, row[0], s.fence)
            if s.driver:
                moved = db.execute(
                    "UPDATE sessions SET driver = ?, disposed_ns = 0 WHERE session_id = ?",
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
                db.executemany(INSERT_REQUEST, s.requests)


def _refuse(db: sqlite3.Connection, session_id: str, first_seq: int, fence: int) -> None:
    """Raise why an append was refused: no such session, or another writer.

    Another writer either superseded the claim or stored the seqs these events take.
    """
    row = db.execute(
        "SELECT fence, event_count FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    check_fence(session_id, row[0], fence)
    raise StoreConflict(
        f'session "{session_id}": event {first_seq} does not follow the {row[1]} stored'
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
        try:
            kind_at = None
            if boundary_seq is not None:
                at = event_at(db, source_id, boundary_seq)
                kind_at = None if at is None else at.WhichOneof("payload") or "unknown"
            end = last_of_kind(db, source_id, TURN_END)
        except DecodeError as error:
            raise SessionDamaged(source_id, f"cannot decode: {error}") from error
        last = None if end is None else end.seq
        count = event_count(db, source_id)
        boundary = fork_boundary(source_id, boundary_seq, count, kind_at, last)
        seed = boundary - FIRST_SEQ + 1
        try:
            db.execute(
                "INSERT INTO sessions (session_id, header, create_ns, options, event_count)"
                " SELECT ?, ?, ?, options, ? FROM sessions WHERE session_id = ?",
                (new_id, header_of(seed), create_ns, seed, source_id),
            )
        except sqlite3.IntegrityError:
            raise AlreadyExists(f'session "{new_id}" already exists') from None
        db.execute(
            "INSERT INTO events SELECT ?, seq, kind, event, count, kinds FROM events"
            " WHERE session_id = ? AND seq <= ? AND seq + count - 1 <= ?",
            (new_id, source_id, boundary, boundary),
        )
        _copy_split(db, source_id, new_id, boundary)
    return seed


def _copy_split(db: sqlite3.Connection, source_id: str, new_id: str, boundary: int) -> None:
    """Copy the head of the source's row that runs past `boundary`, if one does."""
    row = db.execute(
        "SELECT seq, count, event FROM events WHERE session_id = ? AND seq <= ?"
        " ORDER BY seq DESC LIMIT 1",
        (source_id, boundary),
    ).fetchone()
    if row is None or row[0] + row[1] - 1 <= boundary:
        return
    seq, count, blob = row
    try:
        raws = unpack(blob, count)[: boundary - seq + 1]
        events = [ev.SessionEvent.FromString(raw) for raw in raws]
        kinds = [KIND_NUMBERS[e.WhichOneof("payload") or ""] for e in events]
    except (DecodeError, KeyError) as error:
        raise SessionDamaged(source_id, f"cannot decode event {seq}: {error}") from error
    db.execute(INSERT_ROW, (new_id, seq, kinds[0], pack(raws), len(raws), kinds_of(kinds)))


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


def summary_row(db: sqlite3.Connection, session_id: str) -> tuple[bytes, int, int, int, int]:
    """Header bytes, event count, last turn, inbox size and disposal time of a session."""
    row = db.execute(
        "SELECT header, disposed_ns FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    pending = db.execute(
        "SELECT COUNT(*) FROM inbox WHERE session_id = ?", (session_id,)
    ).fetchone()[0]
    return row[0], event_count(db, session_id), last_turn(db, session_id), pending, row[1]
