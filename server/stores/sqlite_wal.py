"""The SQLite store's WAL upkeep: checkpoints that keep the WAL bounded under nonstop commits.

Commits append frames (a page and its header) to the WAL; a checkpoint copies their pages
into the database file. The WAL starts over (the next commit writes from its start) only
when a checkpoint has copied every frame and no reader still reads from the WAL when that
commit begins (SQLite's wal.c decides it there). A checkpoint beside commits that never
pause never gets there: frames land while it copies, so the WAL only grew (measured: to
230 MB in 30 s at 100 agents). Hence a checkpoint (`fold`) in rounds, all on a
connection and a thread of its own, so that reads (on the reader's connection and
thread) go on while it runs and never queue behind it:

1. PASSIVE passes while commits go on. The first syncs the WAL and copies every frame
   committed when it began; each next one the few committed meanwhile. Between passes the
   database file and the WAL are synced (`flush`) while commits go on, so that little
   is left for the last pass to sync. A pass cannot copy frames committed after a read
   in flight began (that read still reads the older pages from the database file): it
   copies up to there, and the next pass the rest.
2. A last pass holding the store's write lock: no commit runs, so it copies the last
   few frames and syncs the database file. It is a RESTART pass: it also waits for the
   read in flight, if one still reads from the WAL (there is one reader thread; a read
   that begins once every frame is copied reads the database file alone), so that the
   next commit starts the WAL over. It waits `READ_WAIT_MS` at most: after a longer
   read (or another process's) this checkpoint does not fold, and the next one tries
   again. Reads go on throughout. A commit that comes meanwhile awaits `let_go` (the
   loop goes on) and is then written on the loop's thread as usual: sent to the writer
   thread instead, it waited 20-60 ms there for the interpreter lock under load, and
   the burst of work it then released stalled the loop.

Commits are held back only for that last pass: a few frames to copy, two syncs of
little data and the rest of a read in flight, if any (at most 15-20 ms measured at 100
agents on a shared 2-core machine; mostly a few). One pass holding the lock right after
one beside the commits, without the syncs between, held them for 20 to 100 ms: its sync
of the database carried all of the first pass's pages.

Pages are counted per commit (an estimate: `SqliteStore.commit`), under the write lock,
so that the count since the last full fold is exact to the commit. A checkpoint starts
every `pages` pages. Should one fall behind (a slow disk) until the WAL holds `cap`
pages since it last started over, the next commit waits for that checkpoint to end: the
WAL stays bounded whatever the disk does (and unless every last pass meets a read that
outlasts `READ_WAIT_MS`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

PASSES = 3
"""The most passes beside the commits before the one that holds them."""

FEW_FRAMES = 64
"""Frames left after a pass beside the commits few enough for the pass that holds them."""

READ_WAIT_MS = 50
"""The longest the last pass waits for a read still reading from the WAL (the busy
timeout of the checkpoint's connection; commits wait meanwhile). Reads in SQLite mostly
take far less: a small read 0.1 ms at the median and 4 ms at p99, timed on a loaded 2-core
machine under `bench.checkpoint_reads_bench`. One that does not costs this checkpoint's
fold, not a longer hold of the commits."""

FDS = "/proc/self/fd"
"""Where `flush` finds SQLite's own descriptors of the files (Linux; elsewhere none)."""


@dataclass
class WalStats:
    """What the checkpoints did (figures for benchmarks and tests)."""

    checkpoints: int = 0
    """Checkpoints started."""
    folds: int = 0
    """Checkpoints that copied every frame: the WAL starts over at the next commit."""
    longest_wal: int = 0
    """The most frames the WAL held when a checkpoint began."""
    most_left: int = 0
    """The most frames a last pass (the one holding commits back) had to copy."""
    longest_hold: float = 0.0
    """The longest last pass, in seconds: commits waited at most this long on one."""
    waits: int = 0
    """Commits that waited for a checkpoint because the WAL had reached its cap."""


class WalUpkeep:
    """The page counts of one store's WAL and its checkpoints."""

    def __init__(self, path: str, lock: threading.Lock, pages: int, cap: int) -> None:
        self.path = path
        """The database file."""
        self.lock = lock
        """The store's write lock: held by every commit while it writes."""
        self.pages = pages
        self.cap = cap
        self.written = 0
        """Pages written by commits so far (counted under the write lock)."""
        self.folded_at = 0
        """`written` when a checkpoint last copied every frame: the WAL started over since."""
        self.started_at = 0
        """`written` when the last checkpoint started."""
        self.holding = False
        """Whether a checkpoint's last pass holds the write lock (commits wait for it)."""
        self.running: asyncio.Future[None] | None = None
        self.released: asyncio.Future[None] | None = None
        """Resolved (from the checkpoint thread) once the last pass lets go of the lock."""
        self.stats = WalStats()
        self._fds: list[int] = []
        """SQLite's descriptors of the database file and the WAL (found by `flush`)."""

    def wrote(self, pages: int) -> None:
        """Count a commit's pages (called holding the write lock, right after it wrote)."""
        self.written += pages

    def due(self) -> bool:
        """Whether a checkpoint should start now (none runs, `pages` written since the last)."""
        return not self.busy() and self.written - self.started_at > self.pages

    def busy(self) -> bool:
        """Whether a checkpoint runs."""
        return self.running is not None and not self.running.done()

    def full(self) -> bool:
        """Whether the WAL holds `cap` pages while a checkpoint runs (a commit then waits)."""
        return self.busy() and self.written - self.folded_at > self.cap

    async def done(self) -> None:
        """Wait until the running checkpoint ends (a waiter's cancellation leaves it be)."""
        if self.running is not None and not self.running.done():
            await asyncio.wait([self.running])

    async def let_go(self) -> None:
        """Wait until the last pass lets go of the write lock (only called while `holding`)."""
        if self.released is not None and not self.released.done():
            await asyncio.wait([self.released])

    def start(self, running: asyncio.Future[None]) -> None:
        """Note the checkpoint that starts now (`fold` on the checkpoint thread)."""
        self.started_at = self.written
        self.running = running
        self.released = released = running.get_loop().create_future()
        running.add_done_callback(lambda _: resolve(released))
        self.stats.checkpoints += 1
        running.add_done_callback(ended)

    def fold(self, db: sqlite3.Connection) -> None:
        """A checkpoint's passes (on the checkpoint thread, with its own connection)."""
        stats = self.stats
        busy, frames, copied = checkpoint(db)
        stats.longest_wal = max(stats.longest_wal, frames)
        for _ in range(PASSES - 1):
            if busy:  # another checkpoint runs (another process): the next one may fold
                return
            self.flush()
            busy, more, copied = checkpoint(db)
            few = (more - frames if more >= frames else more) <= FEW_FRAMES  # (or it started over)
            frames = more
            if few and copied == frames:  # (a read in flight may have held a pass back)
                break
        if busy or copied < frames:  # a read held every pass back (another process's?)
            return
        self.flush()
        began = time.perf_counter()
        self.holding = True  # from now on commits wait (and do not take the writer thread)
        try:
            with self.lock:  # no commit runs now; reads go on, on their own thread
                written = self.written
                # The pass runs in the statement's first step; reading its row steps again,
                # which can wait for the interpreter lock: that is done after letting go.
                cursor = db.execute("PRAGMA wal_checkpoint(RESTART)")
        finally:
            self.holding = False
            released = self.released
            if released is not None:
                released.get_loop().call_soon_threadsafe(resolve, released)
        stats.longest_hold = max(stats.longest_hold, time.perf_counter() - began)
        busy, last, done = row(cursor)
        if not busy and done == last:
            self.folded_at = written
            stats.folds += 1
        stats.most_left = max(stats.most_left, last - frames if last >= frames else last)

    def flush(self) -> None:
        """Sync the database file and the WAL, beside the commits (they go on meanwhile).

        SQLite's own descriptors are synced, one per file: each of the store's connections
        (writer, reader, checkpoint) has its own, and syncing any one of them syncs the
        file. Opening and closing one here would drop the process's POSIX locks on the
        file, which are SQLite's. Without /proc, nothing (the last pass then syncs more).
        """
        if not all(self._names(fd) for fd in self._fds):
            self._fds = []
        if not self._fds:
            try:
                names = os.listdir(FDS)
            except OSError:
                return
            found = {self._names(int(name)): int(name) for name in names}
            self._fds = [fd for target, fd in found.items() if target]
        for fd in self._fds:
            try:
                os.fdatasync(fd)
            except OSError:  # closed meanwhile: found again next time
                self._fds = []

    def _names(self, fd: int) -> str:
        """The file of `fd` if it is the database file or its WAL, else ''."""
        try:
            target = os.readlink(f"{FDS}/{fd}")
        except OSError:
            return ""
        return target if target in (self.path, f"{self.path}-wal") else ""


def ended(running: asyncio.Future[None]) -> None:
    """Log a checkpoint that failed (the next one tries again; commits go on)."""
    if not running.cancelled() and running.exception() is not None:
        log.warning("WAL checkpoint failed: %s", running.exception())


def resolve(released: asyncio.Future[None]) -> None:
    """Let the commits waiting for a last pass go."""
    if not released.done():
        released.set_result(None)


def checkpoint(db: sqlite3.Connection) -> tuple[int, int, int]:
    """One PASSIVE pass: (busy, frames in the WAL, frames in it copied so far)."""
    return row(db.execute("PRAGMA wal_checkpoint(PASSIVE)"))


def row(cursor: sqlite3.Cursor) -> tuple[int, int, int]:
    """The row of a checkpoint pragma."""
    busy, frames, copied = cursor.fetchone()
    return int(busy), int(frames), int(copied)
