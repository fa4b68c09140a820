"""Group commit: every write made within one loop tick reaches the store in one transaction.

Session appends, inbox entries and request records are collected in the pending
`Commit`. At the end of the tick (or as soon as the commit in flight lands) the
pending commit goes to the store whole; while it is written, new writes collect in
the next one, so the batch grows with the load and a burst of chunks costs one
transaction, not one each. Only once a commit is durable are its events published:
the sessions advance their durable mark (which wakes streams and the post-commit
observers) and the callbacks waiting for that point run, in order. Nothing reaches
a client, a plugin or an RPC reply before it is stored.

A store that fails (a full disk, an I/O error, a lost connection) is retried with
backoff: writers wait, nothing is dropped. A refusal that is about one session (its
events do not follow the stored ones, or its claim was superseded: another writer)
fails that session alone, and its agent stops; the others commit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import AlreadyExists, NotFound
from server.observability import observe
from server.observability.logs import fields
from server.stores import (
    Commit,
    InboxEntry,
    RequestRecord,
    SessionStore,
    SessionWrites,
    StoreConflict,
    StoreUnavailable,
)

REFUSALS = (StoreConflict, AlreadyExists, NotFound)
"""What a store says about one session's writes that no retry can change."""

if TYPE_CHECKING:
    from server.sessions.session import SessionLog

log = logging.getLogger(__name__)

GATHER_PASSES = 4
"""The most loop passes a pending commit waits for the ready work to run out (`_gather`):
under load, the writes of those passes share one transaction (one BEGIN/COMMIT, each
page written once) instead of a commit every other pass."""

GATHER_BUSY = 4
"""Ready callbacks from which the loop counts as loaded (`_gather`)."""

GATHER_BUSY_REMOTE = 1
"""The same for a store a round trip away (`SessionStore.remote`): any ready callback
may still write (a turn's next events, computed without waiting on anything), and
writes that miss a commit in flight wait a whole round trip for the next one. A turn's
events up to its tool call so share one commit, where they took two or three."""

RETRY_INITIAL = 0.05
RETRY_MAX = 1.0
"""Seconds: a commit is retried at least this often while the store is away, so that
the writes waiting for it land within a second of its return."""


class _Group:
    """One commit with the sessions it publishes and the callbacks that follow it."""

    def __init__(self) -> None:
        self.commit = Commit()
        self.sessions: dict[str, SessionLog] = {}
        self.callbacks: list[Callable[[], None]] = []
        self.done: asyncio.Future[None] | None = None
        self.waiters: list[asyncio.Future[None]] = []
        """One future per `Journal.waiter` caller, resolved with `done`."""

    def future(self) -> asyncio.Future[None]:
        if self.done is None:
            self.done = asyncio.get_running_loop().create_future()
        return self.done

    def idle(self) -> bool:
        return not self.sessions and not self.callbacks and self.commit.empty()

    def resolve(self) -> None:
        """Answer everyone waiting for this group (`done` and each `waiters` future)."""
        if self.done is not None and not self.done.done():
            self.done.set_result(None)
        for waiter in self.waiters:
            if not waiter.done():  # else its caller gave up (cancelled)
                waiter.set_result(None)


class Journal:
    """The write-ahead path from the loop to the store."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._busy = GATHER_BUSY_REMOTE if store.remote else GATHER_BUSY
        self._pending = _Group()
        self._inflight: _Group | None = None
        self._scheduled = False
        self._closed = False
        self.commits = 0
        """Transactions written (a figure for benchmarks and tests)."""

    # -- writes ------------------------------------------------------------------------

    def append(
        self, session: SessionLog, event: ev.SessionEvent, consumes: tuple[int, ...]
    ) -> None:
        """Write `event` (and remove the inbox entries it records) in the next commit."""
        writes = self._pending.commit.sessions.get(session.session_id)
        if (
            writes is None  # the session's first write of this commit
            or session.failure is not None
            or writes.fence != session.fence
            or not (self._scheduled or self._inflight is not None)  # else: `_schedule` now
        ):
            writes = self._writes(session)
        writes.events.append(event)
        if consumes:
            self._take(writes, consumes)

    async def write_now(self, session_id: str, writes: SessionWrites) -> None:
        """Write one session's writes at once, in a transaction of their own.

        For the writes that must be stored before the session is used at all, so that
        nothing of it is pending yet: a creation's publication (the header, the driver,
        the claim) and a crash repair's closers.
        """
        await self.store.commit(Commit({session_id: writes}))
        self.commits += 1

    def put(self, session: SessionLog, entry: InboxEntry) -> None:
        """Add an accepted message to the session's durable inbox."""
        self._writes(session).inbox_put.append(entry)

    def take(self, session: SessionLog, entry_ids: tuple[int, ...]) -> None:
        """Remove inbox entries that an event of this commit records."""
        self._take(self._writes(session), entry_ids)

    def record(self, session: SessionLog, record: RequestRecord) -> None:
        """Keep the first answer of a call made with a request id."""
        self._writes(session).requests.append(record)

    def drive(self, session: SessionLog, agent_id: str) -> None:
        """Record that `agent_id` now drives the session."""
        self._writes(session).driver = agent_id

    def after_commit(self, callback: Callable[[], None], session: SessionLog | None = None) -> None:
        """Run `callback` once everything written so far is durable (now if it is).

        With a `session`, once everything that session wrote so far is: a notification
        about one session waits for its own writes, not for the other sessions' (so it
        is not a commit late under load). Callbacks of one session keep their order.
        """
        if session is not None:
            for group in (self._pending, self._inflight):
                if group is not None and session.session_id in group.sessions:
                    group.callbacks.append(callback)
                    self._schedule()
                    return
            callback()
            return
        if self._pending.idle() and self._inflight is None:
            callback()
            return
        group = self._pending if not self._pending.idle() else self._inflight
        assert group is not None
        group.callbacks.append(callback)
        self._schedule()

    def sync(self) -> asyncio.Future[None]:
        """A future that resolves once everything written so far is durable."""
        if not self._pending.idle():
            return self._pending.future()
        if self._inflight is not None:
            return self._inflight.future()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def waiter(self) -> asyncio.Future[None] | None:
        """A future of the caller's own, resolved once all written so far is durable.

        None when it is already. `sync`'s future is shared, so an awaiter must shield
        it (a cancel would reach every waiter), and a shield costs two passes of the
        event loop more before the awaiter runs on. This one is the caller's alone: it
        may be awaited as it is.
        """
        group = self._pending if not self._pending.idle() else self._inflight
        if group is None:
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        group.waiters.append(waiter)
        return waiter

    async def drain(self) -> None:
        """Wait until nothing is pending or in flight (shutdown)."""
        while not self._pending.idle() or self._inflight is not None:
            await asyncio.shield(self.sync())

    # -- the commit loop ---------------------------------------------------------------

    def _writes(self, session: SessionLog) -> SessionWrites:
        if session.failure is not None:  # it can never commit again: write nowhere
            return SessionWrites()
        self._pending.sessions[session.session_id] = session
        self._schedule()
        writes = self._pending.commit.of(session.session_id)
        writes.fence = session.fence
        writes.encode = session.encoded  # the store's bytes are those the streams send
        return writes

    @staticmethod
    def _take(writes: SessionWrites, entry_ids: tuple[int, ...]) -> None:
        for entry_id in entry_ids:
            put = next((e for e in writes.inbox_put if e.entry_id == entry_id), None)
            if put is not None:  # accepted and recorded within one commit: never stored
                writes.inbox_put.remove(put)
            else:
                writes.inbox_take.append(entry_id)

    def _schedule(self) -> None:
        if self._inflight is None and not self._scheduled:
            self._scheduled = True
            loop = asyncio.get_running_loop()
            loop.call_soon(self._gather, loop, 0)

    def _gather(self, loop: asyncio.AbstractEventLoop, passes: int, seen: int = 0) -> None:
        """Start the commit once the loop has run what was ready, within `GATHER_PASSES`.

        One more pass when anything else is ready: the tasks this tick woke (a driver
        woken by a message, a stream reader) add their writes to the same commit. With
        nothing ready (a lone writer waiting for its commit) no other write can come
        before the next pass, so the commit starts now. Then, while the loop is loaded
        (`GATHER_BUSY` callbacks or more still ready: other agents' steps, replies,
        streams), a few passes more: their writes join this commit instead of each
        making its own. For a remote store, any ready callback counts as load
        (`GATHER_BUSY_REMOTE`).

        A loop whose ready queue is not visible (uvloop's, the server's default) always
        gets the one more pass, and its load shows in the writes themselves: a few
        passes more while each pass brings new ones (`_arrivals`; `seen` is the count
        at the last pass).
        """
        ready = getattr(loop, "_ready", None)
        if ready is None:
            arrived = self._arrivals()
            more = passes == 0 or (passes < GATHER_PASSES and arrived > seen)
        else:
            arrived, waiting = 0, len(ready)
            more = (passes == 0 and waiting > 0) or (
                passes < GATHER_PASSES and waiting >= self._busy
            )
        if more:
            loop.call_soon(self._gather, loop, passes + 1, arrived)
            return
        self._start()

    def _arrivals(self) -> int:
        """How much the pending commit holds, as a sign of load where the loop hides it.

        For a local store, the sessions that wrote: other agents writing is load, a lone
        turn's next events are not (as `GATHER_BUSY` counts only several ready
        callbacks). For a remote store, the events: any write that can still join saves
        it a round trip (as `GATHER_BUSY_REMOTE` counts any ready callback).
        """
        if self.store.remote:
            return sum(len(w.events) for w in self._pending.commit.sessions.values())
        return len(self._pending.sessions)

    def _start(self) -> None:
        self._scheduled = False
        if self._inflight is not None or self._pending.idle():
            return
        group, self._pending = self._pending, _Group()
        self._inflight = group
        if self._written_now(group):
            self._land(group, stored=True)
        else:
            asyncio.get_running_loop().create_task(self._run(group), name="journal-commit")

    def _written_now(self, group: _Group) -> bool:
        """Whether the store wrote the group at once (its `commit_now`): no task to start.

        A store that can write without waiting (memory; SQLite's small commits) saves
        the commit a task and the loop pass to run it. Anything else (a commit that must
        wait, a refusal, an outage) goes to `_run`, which tries again, finds whose a
        refusal is, or retries the outage.
        """
        if group.commit.empty():
            return True
        commit_now = getattr(self.store, "commit_now", None)
        if commit_now is None or self._closed:
            return False
        started = time.perf_counter()
        try:
            if not commit_now(group.commit):
                return False
        except Exception:  # nothing was written: `_run` tells a refusal from an outage
            return False
        self.commits += 1
        if observe.store_commit is not None:  # the metric of commit latency, when on
            observe.store_commit(time.perf_counter() - started)
        return True

    async def _run(self, group: _Group) -> None:
        stored = False
        try:
            await self._write(group)
            stored = True
        except BaseException as error:  # closed, or cancelled at exit: nothing was stored
            for session in group.sessions.values():
                session.fail(StoreUnavailable(f"the session store is unavailable: {error}"))
            if not isinstance(error, Exception):
                raise
        finally:
            self._land(group, stored=stored)

    def _land(self, group: _Group, *, stored: bool) -> None:
        """After the group's commit: publish what it stored, answer its waiters, start the next."""
        try:
            if stored:
                for session_id, session in group.sessions.items():
                    writes = group.commit.sessions.get(session_id)
                    if writes is not None and session.failure is None:
                        session.published(writes.events)
                for callback in group.callbacks:
                    try:
                        callback()
                    except Exception:
                        log.warning("a post-commit callback failed", exc_info=True)
        finally:
            group.resolve()  # waiters check their session's failure
            self._inflight = None
            if not self._pending.idle():
                self._start()

    async def _write(self, group: _Group) -> None:
        """Commit the group, retrying outages; a refused session fails alone."""
        if group.commit.empty():
            return
        try:
            await self._commit(group.commit, group.sessions)
            return
        except REFUSALS:
            pass  # a refusal, not an outage: find whose
        for session_id, writes in group.commit.sessions.items():
            try:
                await self._commit(Commit(sessions={session_id: writes}))
            except REFUSALS as error:
                log.error(
                    "session %s: commit refused: %s", session_id, error,
                    extra=fields(session=session_id),
                )  # fmt: skip
                group.sessions[session_id].fail(error)
                self._forget(session_id)

    async def _commit(self, commit: Commit, sessions: dict[str, SessionLog] | None = None) -> None:
        """One commit, retried with backoff while the store is unavailable.

        Each attempt leaves out the writes of `sessions` that failed meanwhile (a
        replica that lost an agent while its commits waited: they would only meet the
        fence), unless an earlier attempt may have landed them (`unsure`: the store
        checks).
        """
        delay = RETRY_INITIAL
        while True:
            if self._closed:
                raise StoreUnavailable("the journal was closed with writes not stored")
            if sessions and not commit.unsure:  # inline: this runs for every commit
                left_out = False
                for session_id, session in sessions.items():
                    if session.failure is not None:
                        left_out = commit.sessions.pop(session_id, None) is not None or left_out
                if left_out and commit.empty():
                    return  # only failed sessions' writes: nothing to store
            try:
                started = time.perf_counter()
                await self.store.commit(commit)
                self.commits += 1
                if observe.store_commit is not None:  # the metric of commit latency, when on
                    observe.store_commit(time.perf_counter() - started)
                return
            except REFUSALS:
                raise
            except Exception as error:  # an outage: a full disk, a lost connection
                # Once at ERROR per outage; its retries (every second at most) at WARNING.
                level = logging.ERROR if delay == RETRY_INITIAL else logging.WARNING
                log.log(level, "session store commit failed: %s; retrying in %.2f s", error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)

    def close(self) -> None:
        """Stop retrying (shutdown): writes still unstored fail their sessions."""
        self._closed = True

    def _forget(self, session_id: str) -> None:
        """Drop the pending writes of a failed session: they can never follow."""
        pending = self._pending
        pending.commit.sessions.pop(session_id, None)
        pending.sessions.pop(session_id, None)
        if pending.idle() and (pending.done is not None or pending.waiters):
            # Its waiters waited for those writes only: nothing is left to store, and an
            # idle group is never started, so they are answered here (they find the failure).
            pending.resolve()
            self._pending = _Group()
