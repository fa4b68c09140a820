"""The session catalogue: the sessions of a server, live and stored, for reading.

Listing, describing, reading (a stored session is loaded read-only and repaired of a
crash tail when this server may), following a session another server drives, and
forking. The agents that drive live sessions are the lifecycle's (`server/lifecycle/factory.py`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.kernel.errors import AlreadyExists, SessionDamaged
from server.kernel.ids import check_id
from server.observability.logs import fields
from server.sessions.journal import Journal
from server.sessions.repair import crash_closers
from server.sessions.replay import replay_tail
from server.sessions.session import SessionLog, now_timestamp, session_message
from server.stores import FIRST_SEQ, SessionStore, SessionWrites

log = logging.getLogger(__name__)

FOLLOW_POLL = 0.5
"""Seconds a follower of a session another server drives waits for a notification
before it reads the store again anyway."""

FOLLOW_BATCH = 500

EARLIER_SESSIONS = 3
"""How many of a config agent's earlier sessions its start checks for an open turn."""

READ_CACHE = 8
"""How many stored sessions stay loaded for reading."""


class SessionCatalogue:
    """Every session of the store and the live ones, as readers see them."""

    def __init__(
        self,
        store: SessionStore,
        journal: Journal,
        window: int,
        *,
        live: dict[str, SessionLog],
        reserved: set[str],
        still_driven: Callable[[str], Awaitable[bool]],
    ) -> None:
        self.store = store
        self.journal = journal
        self.window = window
        self.live = live
        """Sessions with a live agent, by id (the lifecycle's registry, read here)."""
        self.reserved = reserved
        """Session ids taken by an agent being created, live, or being torn down."""
        self.still_driven = still_driven
        """Whether any server still drives a session (replicas: by lease)."""
        self.repair_on_read = True
        """Repair a crashed session's open turn when it is read (a single server)."""
        self.live_may_lag = False
        """Whether another server may write a session live here (replicas: a takeover
        while this one was paused or cut off), so that a read checks the store first."""
        self._loading: dict[str, asyncio.Lock] = {}
        self._verified: dict[str, int] = {}
        """Stored sessions read whole without damage, with their event count then."""
        self._readonly: OrderedDict[str, SessionLog] = OrderedDict()
        """The latest stored sessions loaded for reading (paging through a log reuses them)."""

    async def session(self, session_id: str) -> SessionLog:
        """A live session, or a stored one loaded read-only (kept while it is unchanged)."""
        check_id("session_id", session_id)
        live = self.live.get(session_id)
        if live is not None:
            return await self.current(live)
        return await self._stored(session_id)

    async def current(self, live: SessionLog) -> SessionLog:
        """`live`, unless the store holds events past it: then the stored log, read-only.

        Reads are monotonic: whatever a stream delivered (from any replica) was stored
        first, so a read answered from the store, or from a live copy the store has
        nothing past, holds it. A live copy falls behind when another replica took the
        session over while this one was paused or cut off, until this one stops its agent.
        """
        if not self.live_may_lag:
            return live
        stored = (await self.store.summary(live.session_id)).event_count
        if stored <= live.stored:
            return live
        return await self._stored(live.session_id)

    async def _stored(self, session_id: str) -> SessionLog:
        """The stored session, loaded read-only (the copy kept while it is unchanged)."""
        cached = self._readonly.get(session_id)
        if cached is not None:
            summary = await self.store.summary(session_id)
            if summary.event_count == len(cached):
                if self._readonly.get(session_id) is cached:  # not evicted while we waited
                    self._readonly.move_to_end(session_id)
                return cached
        loaded = await self.load(session_id)
        self._readonly[session_id] = loaded
        if len(self._readonly) > READ_CACHE:
            self._readonly.popitem(last=False)
        return loaded

    async def load(self, session_id: str, *, fence: int = 0) -> SessionLog:
        """Load a stored session, closing (durably) a turn that a crash left open.

        Only a server that may drive the session repairs it: one that claimed it
        (`fence`, resuming it), or a single server reading a session nobody drives
        (`repair_on_read`). A replica merely reading a session shows its stored log as
        it is: the open turn may be another replica's running turn.

        Loads of one session are serialised, so that concurrent readers of a crashed
        session store its repair once and all see the repaired log.
        """
        store = self.store
        lock = self._loading.setdefault(session_id, asyncio.Lock())
        try:
            async with lock:
                # The tail a replay needs, then the rest of the session (and any event
                # stored meanwhile) in one snapshot.
                count = (await store.summary(session_id)).event_count
                tail = await replay_tail(store, session_id, count)
                stored = await store.load(session_id, start=FIRST_SEQ + count)
                events = [*tail, *stored.events]
                repair = bool(fence) or self.repair_on_read
                closers = crash_closers(events) if repair else []
                if closers:
                    log.warning(
                        "session %s: closing turn %d interrupted by a crash",
                        session_id,
                        closers[-1].turn_end.turn,
                        extra=fields(session=session_id, turn=closers[-1].turn_end.turn),
                    )
                    writes = SessionWrites(events=closers, fence=fence)
                    await self.journal.write_now(session_id, writes)
        finally:
            if not lock.locked() and self._loading.get(session_id) is lock:
                del self._loading[session_id]
        session = SessionLog(
            session_id,
            stored.header,
            self.journal,
            inbox=stored.inbox,
            window=self.window,
            options=stored.options,
            first_seq=events[0].seq if events else FIRST_SEQ,
        )
        # A long log is O(events) to project: other tasks run between slices of it.
        await session.seed_in_slices([*events, *closers])
        self._verified[session_id] = len(session)
        return session

    def forget(self, session_id: str) -> None:
        """Drop what this catalogue kept of a session (it was deleted)."""
        self._readonly.pop(session_id, None)
        self._verified.pop(session_id, None)

    async def close_earlier(self, agent_id: str, session_id: str) -> None:
        """Repair the agent's recent earlier sessions a crash left open (a config agent).

        They are the agent's: nobody else drives them (it holds the agent), so the
        repair is written under a claim. Balanced ones (their last event is a
        `turn_end`) are not read.
        """
        store = self.store
        for earlier in (await store.driven_by(agent_id))[:EARLIER_SESSIONS]:
            if earlier == session_id or earlier in self.live:
                continue
            count = (await store.summary(earlier)).event_count
            last = await store.read(earlier, count - 1, count) if count else []
            if last and not last[0].HasField("turn_end"):
                await self.load(earlier, fence=await store.claim(earlier))

    async def follow_stored(
        self, session_id: str, cursor: int, max_bytes: int
    ) -> AsyncIterator[list[ev.SessionEvent]]:
        """Batches of a session another server drives, read from the store as they land.

        The store is the truth: polled, so nothing is missed or repeated whichever
        server writes; it ends once nobody drives the session and all was read.
        """
        store = self.store
        while True:
            events = await store.read(session_id, cursor, cursor + FOLLOW_BATCH)
            batch: list[ev.SessionEvent] = []
            size = 0
            for event in events:
                size += event.ByteSize()
                if batch and size > max_bytes:
                    break
                batch.append(event)
            if batch:
                cursor += len(batch)
                yield batch
                continue
            driven = session_id in self.live  # taken over here meanwhile: still coming
            if not driven and not await self.still_driven(session_id):
                return
            await store.wait_for_events(session_id, FOLLOW_POLL)

    async def session_ids(self) -> list[str]:
        """Every session id, stored or live, sorted."""
        return sorted(set(await self.store.list_ids()) | set(self.live))

    async def describe(self, session_id: str) -> session_pb2.Session:
        """The `Session` resource of a live or stored session.

        A stored session is read whole once (and again when it grew since), so that a
        damaged one is reported with its `load_error`, and a crash tail is repaired,
        before anyone resumes it; after that its stored counts are enough.
        """
        live = self.live.get(session_id)
        if live is not None:
            return session_message(live)
        try:
            summary = await self.store.summary(session_id)
            if self._verified.get(session_id) != summary.event_count:
                return session_message(await self.load(session_id))
        except SessionDamaged as error:
            return session_pb2.Session(session_id=session_id, load_error=str(error))
        return session_pb2.Session(
            session_id=session_id,
            header=summary.header,
            event_count=summary.event_count,
            turn_count=summary.turn_count,
            pending_messages=summary.pending,
        )

    async def fork(
        self, session_id: str, boundary_seq: int | None, new_session_id: str = ""
    ) -> session_pb2.Session:
        """Store a new session seeded with `session_id`'s events up to a `turn_end`.

        The copy is one transaction of the store: after a crash the fork is absent
        or complete. Only stored events can be forked.
        """
        live = self.live.get(session_id)
        source = live if live is not None else await self.session(session_id)  # repairs
        new_session_id = new_session_id or f"{session_id}-fork-{uuid.uuid4()}"
        check_id("new_session_id", new_session_id)
        if new_session_id in self.live or new_session_id in self.reserved:
            raise AlreadyExists(f'session "{new_session_id}" already exists')
        header = session_pb2.SessionHeader(
            cwd=source.header.cwd, parent_session_id=session_id, create_time=now_timestamp()
        )
        await self.store.fork(session_id, boundary_seq, new_session_id, header)
        return await self.describe(new_session_id)
