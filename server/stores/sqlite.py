"""The SQLite session store: one file, WAL, every event stored once as protobuf bytes.

Tables (`sqlite_schema`): `meta` (the format version), `sessions` (the header,
written once, and the agent that last drove it), `events` (a row per session and
commit holding that commit's run of the session's events, keyed by session and first
sequence number, with the payload kinds it holds so that a fork or a count finds its
row without decoding the others: `sqlite_batches`), `inbox` (accepted messages no
turn has recorded yet) and `requests` (the first answer of each call made with a
request id). Storage grows with the content of the log, never with a snapshot per step.

Where the SQL (`sqlite_sql`) runs: small group commits on the event loop's thread (a
WAL append is cheaper than a hop to a thread), large or fsyncing ones on the writer
thread, reads on a reader thread with its own connection (WAL lets it read while a
commit is written), checkpoints in the background on a thread and connection of their
own (`sqlite_wal`: they keep the WAL bounded under commits that never pause; a read
never waits for one). A damaged file or a row that
cannot be decoded is reported as `SessionDamaged` for the session it belongs to.

Durability: with `synchronous=NORMAL` (the default, "process") a committed
transaction survives a crash of the server process; `synchronous=FULL` ("power")
also survives an OS crash or a power loss, at the cost of an fsync per commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import DecodeError

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import SessionDamaged, SessionNotFound
from server.stores import (
    FIRST_SEQ,
    Answer,
    Commit,
    InboxEntry,
    RequestRecord,
    SessionSummary,
    StoreConflict,
    StoredSession,
    StoreUnavailable,
    check_count,
    decode_entry,
    decode_events,
    decode_log,
)
from server.stores.sqlite_lifecycle import delete_session, drop_requests, vacuum_some
from server.stores.sqlite_schema import FORMAT_VERSION, migrate, statements
from server.stores.sqlite_sql import (
    SessionRows,
    adopt_move,
    claim,
    event_rows,
    fork_copy,
    summary_row,
    write_commit,
)
from server.stores.sqlite_wal import READ_WAIT_MS, WalUpkeep

T = TypeVar("T")

INLINE_BYTES = 64 * 1024
"""Commits up to this size are written on the event loop's thread (see `commit`)."""

CHECKPOINT_PAGES = 4096
"""WAL pages (16 MiB of 4 KiB pages) after which a background checkpoint folds the WAL
into the database and it starts over (see `sqlite_wal`)."""

CAP_CHECKPOINTS = 4
"""The WAL's cap, in `CHECKPOINT_PAGES`: a commit that finds it that long while a
checkpoint runs waits for the checkpoint (a disk too slow for the commits)."""

LIMIT_CHECKPOINTS = 2
"""`journal_size_limit`, in `CHECKPOINT_PAGES` of 4 KiB: a WAL that grew past it (a burst,
an older server) shrinks back to it when it starts over; one that stays within it is
written over in place."""

PAGES_PER_SESSION = 4
"""WAL pages counted for each session a commit writes, besides its bytes: a commit
rewrites whole pages (the leaf that takes the rows, and on a split its siblings and
parent), so a row of 60 bytes costs about a page. Measured: 4 to 5 pages per session
per commit; counting a little high keeps the WAL within `CHECKPOINT_PAGES`."""

VACUUM_PAGES = 1024
"""Free pages one step of `reclaim` returns (4 MiB): the writer is held that long at most."""

DURABILITY = {"process": "NORMAL", "power": "FULL"}
"""The `durability` settings and the SQLite `synchronous` mode of each."""


class SqliteStore:
    """Sessions in one SQLite file under a data directory."""

    persistent = True
    remote = False

    def __init__(self, path: str | Path, durability: str = "process") -> None:
        self.path = Path(path)
        self.synchronous = DURABILITY[durability]
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-write")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-read")
        self._checkpointer = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sqlite-checkpoint"
        )
        """Runs the WAL checkpoints, beside the reads (which never queue behind one)."""
        self._write_db: sqlite3.Connection | None = None
        self._read_db: sqlite3.Connection | None = None
        self._checkpoint_db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        """Held while the writing connection is in use (by the loop or the writer thread)."""
        self.wal = WalUpkeep(
            os.path.realpath(self.path),
            self._lock,
            CHECKPOINT_PAGES,
            CAP_CHECKPOINTS * CHECKPOINT_PAGES,
        )
        """The WAL's page counts and checkpoints."""

    # -- connections -------------------------------------------------------------------

    async def _write(self, session_id: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._guarded(session_id, self._writer, self._on_writer, fn)

    async def _read(self, session_id: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._write_db is None:  # the writer creates or migrates the file first
            await self._write(session_id, lambda db: None)
        return await self._guarded(session_id, self._reader, self._on_reader, fn)

    def _on_writer(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._write_db is None:
                self._write_db = self._connect(create=True)
            return fn(self._write_db)

    def _on_reader(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._read_db is None:
            self._read_db = self._connect(create=False)
        return fn(self._read_db)

    def _on_checkpointer(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._checkpoint_db is None:
            db = self._connect(create=False)
            db.execute(f"PRAGMA busy_timeout={READ_WAIT_MS}")  # see `sqlite_wal`
            self._checkpoint_db = db
        return fn(self._checkpoint_db)

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
            if db.execute("PRAGMA page_count").fetchone()[0] == 0:  # a new file, before WAL:
                db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # freed pages can go back later
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={self.synchronous}")
            db.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run off the loop
            db.execute(f"PRAGMA journal_size_limit={LIMIT_CHECKPOINTS * CHECKPOINT_PAGES * 4096}")
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
        """Fold the WAL into the database file, close the connections and the threads.

        A checkpoint under way ends first; then its connection closes, then the reader's;
        the writer's last, on the writer thread after any commit sent there, folds the
        whole WAL in and truncates it (no other connection is left to read from it).
        """

        def close(db: sqlite3.Connection) -> None:
            db.close()

        def fold_and_close(db: sqlite3.Connection) -> None:
            try:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # a clean stop leaves one file
            finally:
                db.close()

        while self.wal.running is not None and not self.wal.running.done():
            await asyncio.gather(self.wal.running, return_exceptions=True)
        if self._checkpoint_db is not None:
            await self._guarded("", self._checkpointer, self._on_checkpointer, close)
            self._checkpoint_db = None
        if self._read_db is not None:
            await self._read("", close)
            self._read_db = None
        if self._write_db is not None:
            await self._write("", fold_and_close)
            self._write_db = None
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self._checkpointer.shutdown(wait=True)

    # -- writes ------------------------------------------------------------------------

    def commit_now(self, commit: Commit) -> bool:
        """Write the commit at once on this thread if it can be, without waiting; whether it was.

        The common case of `commit` (a small commit, nothing in the way), for a caller
        that would otherwise start a task to await it: False when it must wait (a large
        commit, one that must fsync, a checkpoint's last pass, a WAL at its cap, the
        connection busy), and then nothing was written. Raises as `commit` does. False
        for a subclass with a `commit` of its own (a test's watched store): its commits
        go through that one.
        """
        if type(self).commit is not SqliteStore.commit:
            return False
        rows = self._rows(commit)
        size = sum(r.size for r in rows)
        wal = self.wal
        if self.synchronous != "NORMAL" or size > INLINE_BYTES or wal.full() or wal.holding:
            return False
        return self._write_inline(rows, size)

    async def commit(self, commit: Commit) -> None:
        """Write the whole commit in one transaction.

        A small commit (the common case: the events of one loop tick) is written on
        the event loop's own thread: with `synchronous=NORMAL` a WAL append is a copy
        to the page cache and costs less than a hop to a worker thread. A large one,
        one that must fsync, or one that finds the connection busy (a fork copying on
        the writer thread) goes to the writer thread: the loop never waits on a lock.
        One that comes while a checkpoint's last pass holds the lock (`sqlite_wal`, a
        few milliseconds) waits for it, then writes here as usual; so does one that
        finds the WAL at its cap while a checkpoint runs.

        A SQLite error here is an outage (`StoreUnavailable`: a full disk, an I/O
        error, a locked file), which the journal retries; a key collision is a refusal.
        """
        rows = self._rows(commit)
        size = sum(r.size for r in rows)
        wal = self.wal
        if wal.full():  # the WAL at its cap: the checkpoint under way first
            wal.stats.waits += 1
            await wal.done()
        inline = self.synchronous == "NORMAL" and size <= INLINE_BYTES
        if inline and wal.holding:  # a checkpoint's last pass: wait, then write here
            await wal.let_go()
        if inline and self._write_inline(rows, size):
            return
        pages = self._pages(rows, size)

        def write(db: sqlite3.Connection) -> None:  # holding the write lock
            write_commit(db, rows)
            wal.wrote(pages)

        loop = asyncio.get_running_loop()
        with self._sqlite_errors():
            await loop.run_in_executor(self._writer, self._on_writer, write)
        if wal.due():
            self._checkpoint()

    @staticmethod
    def _rows(commit: Commit) -> list[SessionRows]:
        return [SessionRows.of(session_id, w) for session_id, w in commit.sessions.items()]

    @staticmethod
    def _pages(rows: list[SessionRows], size: int) -> int:
        return len(rows) * PAGES_PER_SESSION + size // 4096

    def _write_inline(self, rows: list[SessionRows], size: int) -> bool:
        """Write on the loop's thread if the connection is free now; whether it was."""
        db = self._write_db
        if db is None or not self._lock.acquire(blocking=False):
            return False
        try:
            with self._sqlite_errors():
                write_commit(db, rows)
            self.wal.wrote(self._pages(rows, size))
        finally:
            self._lock.release()
        if self.wal.due():
            self._checkpoint()
        return True

    @contextlib.contextmanager
    def _sqlite_errors(self) -> Iterator[None]:
        """SQLite's errors as the store's: a collision is a refusal, the rest an outage."""
        try:
            yield
        except sqlite3.IntegrityError as error:  # a second writer raced past the checks
            raise StoreConflict(f"{self.path}: {error}") from error
        except sqlite3.Error as error:
            raise StoreUnavailable(f"{self.path}: {error}") from error

    def _checkpoint(self) -> None:
        """Fold the WAL into the database on the checkpoint thread (`sqlite_wal`)."""
        fold = self._guarded("", self._checkpointer, self._on_checkpointer, self.wal.fold)
        self.wal.start(asyncio.ensure_future(fold))

    async def fork(
        self,
        source_id: str,
        boundary_seq: int | None,
        new_id: str,
        header: session_pb2.SessionHeader,
    ) -> int:
        """Copy the source's events up to a `turn_end` into a new session, atomically."""
        create_ns = header.create_time.ToNanoseconds()

        def header_of(seed: int) -> bytes:
            header.seed_length = seed
            return header.SerializeToString()

        def copy(db: sqlite3.Connection) -> int:
            return fork_copy(db, source_id, boundary_seq, new_id, header_of, create_ns)

        return await self._write(source_id, copy)

    async def delete(self, session_id: str, answer: Answer | None = None) -> int:
        """Remove the session, its inbox and its request records, in one transaction."""
        return await self._write(session_id, lambda db: delete_session(db, session_id, answer))

    async def mark_disposed(self, session_id: str, at_ns: int) -> None:
        """Record the disposal of the session's driver (a session gone meanwhile: nothing)."""

        def mark(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE sessions SET disposed_ns = ? WHERE session_id = ?", (at_ns, session_id)
            )

        await self._write(session_id, mark)

    async def drop_requests(self, before_ns: int, limit: int) -> int:
        """Remove up to `limit` request records older than `before_ns`, in one transaction."""
        return await self._write("", lambda db: drop_requests(db, before_ns, limit))

    async def reclaim(self) -> None:
        """Give free pages back to the file system, `VACUUM_PAGES` at a time.

        A file created by this version uses `auto_vacuum = INCREMENTAL`; an older one
        needs one offline `VACUUM` to switch (until then this frees nothing).
        """
        more = True
        while more:  # a step at a time: commits get the writer in between
            more = await self._write("", lambda db: vacuum_some(db, VACUUM_PAGES))

    async def try_lease(self, name: str) -> bool:
        """One server per file: the lease is always free."""
        return True

    async def release_lease(self, name: str) -> None:
        """Nothing to give back."""

    async def claim(self, session_id: str) -> int:
        """A new claim token for the session."""
        return await self._write(session_id, lambda db: claim(db, session_id))

    async def wait_for_events(self, session_id: str, seconds: float) -> None:
        """One server per file: no other writer to hear from; wait the time out."""
        await asyncio.sleep(seconds)

    async def driven_by(self, agent_id: str) -> list[str]:
        """The sessions `agent_id` drove, the most recent first."""

        def query(db: sqlite3.Connection) -> list[str]:
            rows = db.execute(
                "SELECT session_id FROM sessions WHERE driver = ?"
                " ORDER BY create_ns DESC, session_id DESC",
                (agent_id,),
            ).fetchall()
            return [row[0] for row in rows]

        return await self._read("", query)

    async def adopt_pending(self, agent_id: str, session_id: str) -> list[InboxEntry]:
        """Move the other sessions' inbox entries of `agent_id` to `session_id`."""

        def move(db: sqlite3.Connection) -> list[tuple[int, str, bytes]]:
            return adopt_move(db, agent_id, session_id)

        rows = await self._write(session_id, move)
        try:
            return [decode_entry(entry_id, kind, blob) for entry_id, kind, blob in rows]
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode its inbox: {error}") from error

    # -- reads -------------------------------------------------------------------------

    async def exists(self, session_id: str) -> bool:
        """Whether the session is stored."""

        def query(db: sqlite3.Connection) -> bool:
            sql = "SELECT 1 FROM sessions WHERE session_id = ?"
            return db.execute(sql, (session_id,)).fetchone() is not None

        return await self._read(session_id, query)

    async def load(self, session_id: str, start: int = FIRST_SEQ) -> StoredSession:
        """The header, the events from `start` and the inbox, checked for gaps and decode errors."""
        start = max(start, FIRST_SEQ)

        def read(
            db: sqlite3.Connection,
        ) -> tuple[
            tuple[bytes, bytes | None, str, int],
            list[tuple[int, bytes]],
            list[tuple[int, str, bytes]],
        ]:
            db.execute("BEGIN")  # one snapshot for the three reads
            try:
                row = db.execute(
                    "SELECT header, options, driver, event_count FROM sessions"
                    " WHERE session_id = ?",
                    (session_id,),
                ).fetchone()
                if row is None:
                    raise SessionNotFound(session_id)
                events = event_rows(db, session_id, start)
                inbox = db.execute(
                    "SELECT entry_id, kind, message FROM inbox WHERE session_id = ?"
                    " ORDER BY entry_id",
                    (session_id,),
                ).fetchall()
                return (row[0], row[1], row[2], row[3]), events, inbox
            finally:
                db.execute("COMMIT")

        try:
            (header_bytes, options_bytes, driver, recorded), rows, inbox_rows = await self._read(
                session_id, read
            )
        except DecodeError as error:  # a row of several events that does not split into them
            raise SessionDamaged(session_id, f"cannot decode: {error}") from error
        try:
            header = session_pb2.SessionHeader.FromString(header_bytes)
            options = (
                agent_pb2.AgentOptions.FromString(options_bytes)
                if options_bytes is not None
                else None
            )
            events = await decode_log(session_id, start, rows)  # a gap: damaged
            # The tail cut: damaged (events before `start` were not read, but are counted).
            check_count(session_id, recorded, min(start - FIRST_SEQ, recorded) + len(events))
            inbox = [decode_entry(entry_id, kind, blob) for entry_id, kind, blob in inbox_rows]
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode: {error}") from error
        return StoredSession(header, events, inbox, options, driver)

    async def read(self, session_id: str, start: int, end: int) -> list[ev.SessionEvent]:
        """The stored events in `[start, end)`."""
        start = max(start, FIRST_SEQ)

        def query(db: sqlite3.Connection) -> list[tuple[int, bytes]]:
            return event_rows(db, session_id, start, end)

        try:
            rows = await self._read(session_id, query)
            return decode_events(session_id, start, rows)
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode: {error}") from error

    async def summary(self, session_id: str) -> SessionSummary:
        """The header and counts of a session, without reading its events."""

        def read(db: sqlite3.Connection) -> tuple[bytes, int, int, int, int]:
            return summary_row(db, session_id)

        try:
            header, events, turns, pending, disposed_ns = await self._read(session_id, read)
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode: {error}") from error
        try:
            header_message = session_pb2.SessionHeader.FromString(header)
        except DecodeError as error:
            raise SessionDamaged(session_id, f"cannot decode its header: {error}") from error
        return SessionSummary(header_message, events, turns, pending, disposed_ns)

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

    async def session_requests(self, session_id: str) -> list[RequestRecord]:
        """The request records written with the session, with their times."""

        def query(db: sqlite3.Connection) -> list[RequestRecord]:
            rows = db.execute(
                "SELECT agent_id, request_id, method, response, stored_ns FROM requests"
                " WHERE session_id = ? ORDER BY agent_id, request_id",
                (session_id,),
            ).fetchall()
            return [RequestRecord(*row) for row in rows]

        return await self._read(session_id, query)

    async def request_ids(self, agent_id: str, limit: int) -> list[str] | None:
        """Every request id recorded for the agent; None when there are more than `limit`."""

        def query(db: sqlite3.Connection) -> list[str]:
            rows = db.execute(
                "SELECT request_id FROM requests WHERE agent_id = ? LIMIT ?", (agent_id, limit + 1)
            ).fetchall()
            return [row[0] for row in rows]

        ids = await self._read("", query)
        return ids if len(ids) <= limit else None
