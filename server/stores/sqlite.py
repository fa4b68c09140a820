"""The SQLite session store: one file, WAL, every event stored once as protobuf bytes.

Tables: `meta` (the format version), `sessions` (the header, written once, the event
and turn counts kept current by each commit, and the agent that last drove it),
`events` (one row per event, keyed by session and sequence number, with its payload
kind so that a fork can find its boundary without decoding), `inbox` (accepted
messages no turn has recorded yet) and `requests` (the first answer of each call
made with a request id). Storage grows with the content of the log, never with a
snapshot per step.

sqlite3 blocks, so statements run on worker threads: one owns the writing
connection (one transaction per group commit), another a reading connection (WAL
lets it read while a commit is written). A damaged file or a row that cannot be
decoded is reported as `SessionDamaged` for the session it belongs to.

Durability: with `synchronous=NORMAL` (the default, "process") a committed
transaction survives a crash of the server process; `synchronous=FULL` ("power")
also survives an OS crash or a power loss, at the cost of an fsync per commit.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import DecodeError

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.errors import AlreadyExists, NotFound, SessionDamaged
from server.stores import (
    INBOX_CONTEXT,
    Commit,
    InboxEntry,
    RequestRecord,
    SessionSummary,
    StoreConflict,
    StoredSession,
    check_follows,
    fork_boundary,
    turn_of,
)
from server.stores.sqlite_schema import FORMAT_VERSION, migrate, statements

T = TypeVar("T")

DURABILITY = {"process": "NORMAL", "power": "FULL"}
"""The `durability` settings and the SQLite `synchronous` mode of each."""

_PAYLOAD = ev.SessionEvent.DESCRIPTOR.oneofs_by_name["payload"]
_KIND_NUMBERS = {f.name: f.number for f in _PAYLOAD.fields}
_KIND_NAMES = {number: name for name, number in _KIND_NUMBERS.items()}
TURN_END = _KIND_NUMBERS["turn_end"]


def kind_number(event: ev.SessionEvent) -> int:
    """The field number of the event's payload (its kind, as stored)."""
    return _KIND_NUMBERS[event.WhichOneof("payload") or "turn_end"]


class SqliteStore:
    """Sessions in one SQLite file under a data directory."""

    persistent = True

    def __init__(self, path: str | Path, durability: str = "process") -> None:
        self.path = Path(path)
        self.synchronous = DURABILITY[durability]
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-write")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-read")
        self._write_db: sqlite3.Connection | None = None
        self._read_db: sqlite3.Connection | None = None

    # -- connections -------------------------------------------------------------------

    async def _write(self, session_id: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._guarded(session_id, self._writer, self._on_writer, fn)

    async def _read(self, session_id: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._write_db is None:  # the writer creates or migrates the file first
            await self._write(session_id, lambda db: None)
        return await self._guarded(session_id, self._reader, self._on_reader, fn)

    def _on_writer(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._write_db is None:
            self._write_db = self._connect(create=True)
        return fn(self._write_db)

    def _on_reader(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._read_db is None:
            self._read_db = self._connect(create=False)
        return fn(self._read_db)

    async def _guarded(
        self,
        session_id: str,
        executor: ThreadPoolExecutor,
        on_thread: Callable[[Callable[[sqlite3.Connection], T]], T],
        fn: Callable[[sqlite3.Connection], T],
    ) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(executor, on_thread, fn)
        except sqlite3.DatabaseError as error:  # a damaged or unreadable file
            raise SessionDamaged(session_id, f"{self.path}: {error}") from error

    def _connect(self, *, create: bool) -> sqlite3.Connection:
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA busy_timeout=5000")
            if not create:
                return db
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={self.synchronous}")
            row = None
            tables = db.execute("SELECT name FROM sqlite_master WHERE name = 'meta'").fetchone()
            if tables is not None:
                row = db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
            if row is None:
                db.execute("BEGIN IMMEDIATE")
                for statement in statements():
                    db.execute(statement)
                db.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('format_version', ?)", (FORMAT_VERSION,)
                )
                db.execute("COMMIT")
            elif row[0] != FORMAT_VERSION:
                migrate(db, row[0], str(self.path))
        except sqlite3.DatabaseError as error:
            db.close()
            raise SessionDamaged("", f"{self.path}: {error}") from error
        except SessionDamaged:
            db.close()
            raise
        return db

    async def open(self) -> None:
        """Open (and create or migrate) the database now rather than on first use."""
        await self._write("", lambda db: None)

    async def close(self) -> None:
        """Close the connections and the worker threads."""

        def close(db: sqlite3.Connection) -> None:
            db.close()

        if self._write_db is not None:
            await self._write("", close)
            self._write_db = None
        if self._read_db is not None:
            await self._read("", close)
            self._read_db = None
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)

    # -- writes ------------------------------------------------------------------------

    async def commit(self, commit: Commit) -> None:
        """Write the whole commit in one transaction."""
        sessions = [
            (
                session_id,
                writes.create.SerializeToString() if writes.create is not None else None,
                writes.create.create_time.ToNanoseconds() if writes.create is not None else 0,
                writes.driver,
                writes.events,
                [(session_id, e.seq, kind_number(e), e.SerializeToString()) for e in writes.events],
                turn_of(writes.events),
                [
                    (session_id, i.entry_id, i.kind, i.message.SerializeToString())
                    for i in writes.inbox_put
                ],
                [(session_id, entry_id) for entry_id in writes.inbox_take],
                [(r.agent_id, r.request_id, r.method, r.response) for r in writes.requests],
            )
            for session_id, writes in commit.sessions.items()
        ]

        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                for (
                    session_id,
                    header,
                    create_ns,
                    driver,
                    events,
                    rows,
                    turns,
                    puts,
                    takes,
                    requests,
                ) in sessions:
                    if header is not None:
                        try:
                            db.execute(
                                "INSERT INTO sessions (session_id, header, create_ns)"
                                " VALUES (?, ?, ?)",
                                (session_id, header, create_ns),
                            )
                        except sqlite3.IntegrityError:
                            raise AlreadyExists(f'session "{session_id}" already exists') from None
                    count = db.execute(
                        "SELECT event_count FROM sessions WHERE session_id = ?", (session_id,)
                    ).fetchone()
                    if count is None:
                        raise NotFound(f'session "{session_id}" not found')
                    check_follows(session_id, count[0], events)
                    if rows:
                        db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", rows)
                        db.execute(
                            "UPDATE sessions SET event_count = event_count + ?,"
                            " turn_count = MAX(turn_count, ?) WHERE session_id = ?",
                            (len(rows), turns, session_id),
                        )
                    if driver:
                        db.execute(
                            "UPDATE sessions SET driver = ? WHERE session_id = ?",
                            (driver, session_id),
                        )
                    if puts:
                        db.executemany("INSERT INTO inbox VALUES (?, ?, ?, ?)", puts)
                    if takes:
                        db.executemany(
                            "DELETE FROM inbox WHERE session_id = ? AND entry_id = ?", takes
                        )
                    if requests:
                        db.executemany(
                            "INSERT OR IGNORE INTO requests VALUES (?, ?, ?, ?)", requests
                        )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        try:
            await self._write("", write)
        except sqlite3.IntegrityError as error:  # two writers raced past the count check
            raise StoreConflict(str(error)) from error

    async def fork(
        self,
        source_id: str,
        boundary_seq: int | None,
        new_id: str,
        header: session_pb2.SessionHeader,
    ) -> int:
        """Copy the source's events up to a `turn_end` into a new session, atomically."""

        def copy(db: sqlite3.Connection) -> int:
            db.execute("BEGIN IMMEDIATE")
            try:
                count = db.execute(
                    "SELECT event_count FROM sessions WHERE session_id = ?", (source_id,)
                ).fetchone()
                if count is None:
                    raise NotFound(f'session "{source_id}" not found')
                kind_at = None
                if boundary_seq is not None:
                    row = db.execute(
                        "SELECT kind FROM events WHERE session_id = ? AND seq = ?",
                        (source_id, boundary_seq),
                    ).fetchone()
                    kind_at = _KIND_NAMES.get(row[0], "unknown") if row is not None else None
                last = db.execute(
                    "SELECT MAX(seq) FROM events WHERE session_id = ? AND kind = ?",
                    (source_id, TURN_END),
                ).fetchone()[0]
                boundary = fork_boundary(source_id, boundary_seq, count[0], kind_at, last)
                turns = db.execute(
                    "SELECT turn_count FROM sessions WHERE session_id = ?", (source_id,)
                ).fetchone()[0]
                header.seed_length = boundary + 1
                try:
                    db.execute(
                        "INSERT INTO sessions (session_id, header, create_ns, event_count,"
                        " turn_count) VALUES (?, ?, ?, ?, ?)",
                        (
                            new_id,
                            header.SerializeToString(),
                            header.create_time.ToNanoseconds(),
                            boundary + 1,
                            turns,
                        ),
                    )
                except sqlite3.IntegrityError:
                    raise AlreadyExists(f'session "{new_id}" already exists') from None
                db.execute(
                    "INSERT INTO events SELECT ?, seq, kind, event FROM events"
                    " WHERE session_id = ? AND seq <= ?",
                    (new_id, source_id, boundary),
                )
                # The seed may end before the source's last turn: count its own turns.
                seed_turns = _seed_turns(db, new_id)
                db.execute(
                    "UPDATE sessions SET turn_count = ? WHERE session_id = ?",
                    (seed_turns, new_id),
                )
                db.execute("COMMIT")
                return boundary + 1
            except BaseException:
                db.execute("ROLLBACK")
                raise

        return await self._write(source_id, copy)

    async def adopt_pending(self, agent_id: str, session_id: str) -> list[InboxEntry]:
        """Move the other sessions' inbox entries of `agent_id` to `session_id`."""

        def move(db: sqlite3.Connection) -> list[tuple[int, str, bytes]]:
            db.execute("BEGIN IMMEDIATE")
            try:
                rows = db.execute(
                    "SELECT inbox.session_id, entry_id, kind, message FROM inbox"
                    " JOIN sessions USING (session_id)"
                    " WHERE sessions.driver = ? AND inbox.session_id != ?"
                    " ORDER BY sessions.create_ns, inbox.session_id, entry_id",
                    (agent_id, session_id),
                ).fetchall()
                start = db.execute(
                    "SELECT COALESCE(MAX(entry_id), 0) FROM inbox WHERE session_id = ?",
                    (session_id,),
                ).fetchone()[0]
                moved = []
                for offset, (source, entry_id, kind, message) in enumerate(rows, start=1):
                    db.execute(
                        "DELETE FROM inbox WHERE session_id = ? AND entry_id = ?",
                        (source, entry_id),
                    )
                    db.execute(
                        "INSERT INTO inbox VALUES (?, ?, ?, ?)",
                        (session_id, start + offset, kind, message),
                    )
                    moved.append((start + offset, kind, message))
                db.execute("COMMIT")
                return moved
            except BaseException:
                db.execute("ROLLBACK")
                raise

        rows = await self._write(session_id, move)
        try:
            return [_decode_entry(entry_id, kind, blob) for entry_id, kind, blob in rows]
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode its inbox: {error}") from error

    # -- reads -------------------------------------------------------------------------

    async def exists(self, session_id: str) -> bool:
        """Whether the session is stored."""

        def query(db: sqlite3.Connection) -> bool:
            sql = "SELECT 1 FROM sessions WHERE session_id = ?"
            return db.execute(sql, (session_id,)).fetchone() is not None

        return await self._read(session_id, query)

    async def load(self, session_id: str) -> StoredSession:
        """The header, every event and the inbox, checked for gaps and decode errors."""

        def read(
            db: sqlite3.Connection,
        ) -> tuple[bytes, list[tuple[int, bytes]], list[tuple[int, str, bytes]]]:
            db.execute("BEGIN")  # one snapshot for the three reads
            try:
                row = db.execute(
                    "SELECT header FROM sessions WHERE session_id = ?", (session_id,)
                ).fetchone()
                if row is None:
                    raise NotFound(f'session "{session_id}" not found')
                events = db.execute(
                    "SELECT seq, event FROM events WHERE session_id = ? ORDER BY seq",
                    (session_id,),
                ).fetchall()
                inbox = db.execute(
                    "SELECT entry_id, kind, message FROM inbox WHERE session_id = ?"
                    " ORDER BY entry_id",
                    (session_id,),
                ).fetchall()
                return row[0], events, inbox
            finally:
                db.execute("COMMIT")

        header_bytes, rows, inbox_rows = await self._read(session_id, read)
        try:
            header = session_pb2.SessionHeader.FromString(header_bytes)
            events = _decode_events(session_id, 0, rows)
            inbox = [_decode_entry(entry_id, kind, blob) for entry_id, kind, blob in inbox_rows]
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode: {error}") from error
        return StoredSession(header, events, inbox)

    async def read(self, session_id: str, start: int, end: int) -> list[ev.SessionEvent]:
        """The stored events in `[start, end)`."""

        def query(db: sqlite3.Connection) -> list[tuple[int, bytes]]:
            return db.execute(
                "SELECT seq, event FROM events WHERE session_id = ? AND seq >= ? AND seq < ?"
                " ORDER BY seq",
                (session_id, start, end),
            ).fetchall()

        rows = await self._read(session_id, query)
        try:
            return _decode_events(session_id, start, rows)
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode: {error}") from error

    async def summary(self, session_id: str) -> SessionSummary:
        """The header and counts of a session, without reading its events."""

        def read(db: sqlite3.Connection) -> tuple[bytes, int, int, int]:
            row = db.execute(
                "SELECT header, event_count, turn_count,"
                " (SELECT COUNT(*) FROM inbox WHERE inbox.session_id = sessions.session_id)"
                " FROM sessions WHERE session_id = ?",
                (session_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f'session "{session_id}" not found')
            return row[0], row[1], row[2], row[3]

        header, events, turns, pending = await self._read(session_id, read)
        try:
            header_message = session_pb2.SessionHeader.FromString(header)
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode its header: {error}") from error
        return SessionSummary(header_message, events, turns, pending)

    async def list_ids(self) -> list[str]:
        """Every stored session id, sorted."""

        def query(db: sqlite3.Connection) -> list[str]:
            rows = db.execute("SELECT session_id FROM sessions ORDER BY session_id").fetchall()
            return [row[0] for row in rows]

        return await self._read("", query)

    async def find_request(self, agent_id: str, request_id: str) -> RequestRecord | None:
        """The recorded answer of an earlier call, if any."""

        def query(db: sqlite3.Connection) -> tuple[str, bytes] | None:
            row = db.execute(
                "SELECT method, response FROM requests WHERE agent_id = ? AND request_id = ?",
                (agent_id, request_id),
            ).fetchone()
            return None if row is None else (row[0], row[1])

        found = await self._read("", query)
        return None if found is None else RequestRecord(agent_id, request_id, *found)


def _seed_turns(db: sqlite3.Connection, session_id: str) -> int:
    rows = db.execute(
        "SELECT event FROM events WHERE session_id = ? AND kind = ?",
        (session_id, _KIND_NUMBERS["turn_start"]),
    ).fetchall()
    return max((ev.SessionEvent.FromString(r[0]).turn_start.turn for r in rows), default=0)


def _decode_events(
    session_id: str, start: int, rows: list[tuple[int, bytes]]
) -> list[ev.SessionEvent]:
    events = []
    for index, (seq, blob) in enumerate(rows, start=start):
        if seq != index:
            raise SessionDamaged(session_id, f"event {index} is missing")
        event = ev.SessionEvent.FromString(blob)
        if event.seq != seq or event.WhichOneof("payload") is None:
            raise SessionDamaged(session_id, f"event {seq} is not a session event")
        events.append(event)
    return events


def _decode_entry(entry_id: int, kind: str, blob: bytes) -> InboxEntry:
    message: ev.UserMessage | ev.ContextMessage = (
        ev.ContextMessage.FromString(blob)
        if kind == INBOX_CONTEXT
        else ev.UserMessage.FromString(blob)
    )
    return InboxEntry(entry_id, kind, message)
