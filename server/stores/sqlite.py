"""The SQLite session store: one file, WAL, every event stored once as protobuf bytes.

Tables: `meta` (the format version), `sessions` (the header, written once, plus the
event and turn counts kept current by each append) and `events` (one row per event,
keyed by session and sequence number). Storage grows with the content of the log,
never with a snapshot per step.

sqlite3 blocks, so every statement runs on one worker thread that owns the
connection; callers await it. A damaged file or a row that cannot be decoded is
reported as `SessionDamaged` for the session it belongs to.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import DecodeError

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.errors import AlreadyExists, NotFound, SessionDamaged
from server.stores import SessionSummary

FORMAT_VERSION = "1"
"""The on-disk format this code reads and writes."""

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    header BLOB NOT NULL,
    event_count INTEGER NOT NULL DEFAULT 0,
    turn_count INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""


class SqliteStore:
    """Sessions in one SQLite file under a data directory."""

    persistent = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._db: sqlite3.Connection | None = None

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, fn)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._db is None:
            self._db = self._open()
        return fn(self._db)

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a flushed turn survives power loss too
            db.executescript(SCHEMA)
            row = db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('format_version', ?)", (FORMAT_VERSION,))
            elif row[0] != FORMAT_VERSION:
                raise SessionDamaged(
                    "", f"{self.path}: format version {row[0]}, this server reads {FORMAT_VERSION}"
                )
        except sqlite3.DatabaseError as error:
            db.close()
            raise SessionDamaged("", f"{self.path}: {error}") from error
        return db

    async def open(self) -> None:
        """Open (and create) the database now rather than on first use."""
        await self._run(lambda db: None)

    async def close(self) -> None:
        """Close the connection and the worker thread."""

        def close(db: sqlite3.Connection) -> None:
            db.close()

        if self._db is not None:
            await self._run(close)
            self._db = None
        self._executor.shutdown(wait=True)

    async def create(self, session_id: str, header: session_pb2.SessionHeader) -> None:
        """Record a new session and its header."""

        def insert(db: sqlite3.Connection) -> None:
            try:
                db.execute(
                    "INSERT INTO sessions (session_id, header) VALUES (?, ?)",
                    (session_id, header.SerializeToString()),
                )
            except sqlite3.IntegrityError:
                raise AlreadyExists(f'session "{session_id}" already exists') from None

        await self._guarded(session_id, insert)

    async def append(self, session_id: str, events: Sequence[ev.SessionEvent]) -> None:
        """Durably add events after the stored ones, in one transaction."""
        rows = [(session_id, e.seq, e.SerializeToString()) for e in events]
        turns = [e.turn_start.turn for e in events if e.HasField("turn_start")]

        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                count = db.execute(
                    "SELECT event_count FROM sessions WHERE session_id = ?", (session_id,)
                ).fetchone()
                if count is None:
                    raise NotFound(f'session "{session_id}" not found')
                if rows and rows[0][1] != count[0]:
                    raise SessionDamaged(
                        session_id, f"event {rows[0][1]} does not follow the {count[0]} stored"
                    )
                db.executemany("INSERT INTO events VALUES (?, ?, ?)", rows)
                db.execute(
                    "UPDATE sessions SET event_count = event_count + ?,"
                    " turn_count = MAX(turn_count, ?) WHERE session_id = ?",
                    (len(rows), max(turns, default=0), session_id),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        await self._guarded(session_id, write)

    async def exists(self, session_id: str) -> bool:
        """Whether the session is stored."""

        def query(db: sqlite3.Connection) -> bool:
            sql = "SELECT 1 FROM sessions WHERE session_id = ?"
            return db.execute(sql, (session_id,)).fetchone() is not None

        return await self._guarded(session_id, query)

    async def load(
        self, session_id: str
    ) -> tuple[session_pb2.SessionHeader, list[ev.SessionEvent]]:
        """The header and every event of a session, checked for gaps and decode errors."""

        def read(db: sqlite3.Connection) -> tuple[bytes, list[tuple[int, bytes]]]:
            row = db.execute(
                "SELECT header FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f'session "{session_id}" not found')
            events = db.execute(
                "SELECT seq, event FROM events WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
            return row[0], events

        header_bytes, rows = await self._guarded(session_id, read)
        try:
            header = session_pb2.SessionHeader.FromString(header_bytes)
            events = []
            for index, (seq, blob) in enumerate(rows):
                if seq != index:
                    raise SessionDamaged(session_id, f"event {index} is missing")
                event = ev.SessionEvent.FromString(blob)
                if event.seq != seq or event.WhichOneof("payload") is None:
                    raise SessionDamaged(session_id, f"event {seq} is not a session event")
                events.append(event)
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode: {error}") from error
        return header, events

    async def summary(self, session_id: str) -> SessionSummary:
        """The header and counts of a session, without reading its events."""

        def read(db: sqlite3.Connection) -> tuple[bytes, int, int]:
            row = db.execute(
                "SELECT header, event_count, turn_count FROM sessions WHERE session_id = ?",
                (session_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f'session "{session_id}" not found')
            return row[0], row[1], row[2]

        header, events, turns = await self._guarded(session_id, read)
        try:
            return SessionSummary(session_pb2.SessionHeader.FromString(header), events, turns)
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode its header: {error}") from error

    async def list_ids(self) -> list[str]:
        """Every stored session id, sorted."""

        def query(db: sqlite3.Connection) -> list[str]:
            rows = db.execute("SELECT session_id FROM sessions ORDER BY session_id").fetchall()
            return [row[0] for row in rows]

        return await self._guarded("", query)

    async def _guarded(self, session_id: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._run(fn)
        except sqlite3.DatabaseError as error:  # a damaged or unreadable file
            raise SessionDamaged(session_id, f"{self.path}: {error}") from error
