"""An in-memory session store: sessions live as long as the server process."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import AlreadyExists, SessionNotFound
from server.stores import (
    FIRST_SEQ,
    Answer,
    Commit,
    InboxEntry,
    RequestRecord,
    SessionSummary,
    StoredSession,
    check_fence,
    check_follows,
    fork_boundary,
    turn_of,
)


@dataclass
class _Session:
    header: session_pb2.SessionHeader
    driver: str = ""
    options: agent_pb2.AgentOptions | None = None
    events: list[ev.SessionEvent] = field(default_factory=list)
    inbox: dict[int, InboxEntry] = field(default_factory=dict)
    turns: int = 0
    fence: int = 0
    disposed_ns: int = 0


class MemoryStore:
    """Sessions in a dict, for the life of the process.

    A server started with `store: memory` keeps no sessions across restarts and says
    so (`persistent` is False: resume is refused). Tests pass `persistent=True` to
    exercise resume without a file. A commit is checked whole before anything is
    applied, so a refused commit changes nothing, as a rolled-back transaction.
    """

    def __init__(self, *, persistent: bool = False) -> None:
        self.persistent = persistent
        self.remote = False
        self._sessions: dict[str, _Session] = {}
        self._requests: dict[tuple[str, str], RequestRecord] = {}
        self._request_sessions: dict[tuple[str, str], str] = {}
        self._request_times: dict[tuple[str, str], int] = {}
        """The session each request record was written with ('' for a delete's own)."""

    async def open(self) -> None:
        """Nothing to open."""

    async def close(self) -> None:
        """Nothing to release."""

    def commit_now(self, commit: Commit) -> bool:
        """`commit`, at once: a memory store never waits (True), raising as `commit` does.

        False for a subclass with a `commit` of its own (a test's faulty or slow store):
        its commits go through that one.
        """
        if type(self).commit is not MemoryStore.commit:
            return False
        self._apply(commit)
        return True

    async def commit(self, commit: Commit) -> None:
        """Apply every write of the commit, or none."""
        self._apply(commit)

    def _apply(self, commit: Commit) -> None:
        for session_id, writes in commit.sessions.items():
            stored = self._sessions.get(session_id)
            if writes.create is not None:
                if stored is not None:
                    raise AlreadyExists(f'session "{session_id}" already exists')
                check_follows(session_id, 0, writes.events)
            elif stored is None:
                raise SessionNotFound(session_id)
            else:
                check_fence(session_id, stored.fence, writes.fence)
                check_follows(session_id, len(stored.events), writes.events)
        for session_id, writes in commit.sessions.items():
            if writes.create is not None:
                self._sessions[session_id] = _Session(writes.create)
            session = self._sessions[session_id]
            if writes.driver:
                session.driver = writes.driver
                session.disposed_ns = 0
            if writes.options is not None:
                session.options = _copy(writes.options)
            session.events.extend(writes.events)
            session.turns = max(session.turns, turn_of(writes.events))
            for entry in writes.inbox_put:
                session.inbox[entry.entry_id] = entry
            for entry_id in writes.inbox_take:
                session.inbox.pop(entry_id, None)
            for record in writes.requests:
                key = (record.agent_id, record.request_id)
                if key not in self._requests:
                    self._requests[key] = record
                    self._request_sessions[key] = session_id
                    self._request_times[key] = record.stored_ns or time.time_ns()

    async def claim(self, session_id: str) -> int:
        """A new claim token for the session."""
        session = self._get(session_id)
        session.fence += 1
        return session.fence

    async def exists(self, session_id: str) -> bool:
        """Whether the session is stored."""
        return session_id in self._sessions

    async def load(self, session_id: str, start: int = FIRST_SEQ) -> StoredSession:
        """The header, the events from `start` and the inbox of a session."""
        session = self._get(session_id)
        events = session.events[max(start, FIRST_SEQ) - FIRST_SEQ :]
        inbox = [session.inbox[k] for k in sorted(session.inbox)]
        options = _copy(session.options) if session.options is not None else None
        return StoredSession(session.header, events, inbox, options, session.driver)

    async def read(self, session_id: str, start: int, end: int) -> list[ev.SessionEvent]:
        """The stored events in `[start, end)`."""
        first = max(start, FIRST_SEQ) - FIRST_SEQ
        return self._get(session_id).events[first : max(first, end - FIRST_SEQ)]

    async def summary(self, session_id: str) -> SessionSummary:
        """The header and counts of a session."""
        session = self._get(session_id)
        return SessionSummary(
            session.header,
            len(session.events),
            session.turns,
            len(session.inbox),
            session.disposed_ns,
        )

    async def list_ids(self) -> list[str]:
        """Every session id, sorted."""
        return sorted(self._sessions)

    async def fork(
        self,
        source_id: str,
        boundary_seq: int | None,
        new_id: str,
        header: session_pb2.SessionHeader,
    ) -> int:
        """Copy the source's events up to a `turn_end` into a new session."""
        source = self._get(source_id)
        events = source.events
        kind_at = (
            events[boundary_seq - FIRST_SEQ].WhichOneof("payload")
            if boundary_seq is not None and FIRST_SEQ <= boundary_seq < FIRST_SEQ + len(events)
            else None
        )
        ends = [e.seq for e in events if e.HasField("turn_end")]
        boundary = fork_boundary(
            source_id, boundary_seq, len(events), kind_at, ends[-1] if ends else None
        )
        if new_id in self._sessions:
            raise AlreadyExists(f'session "{new_id}" already exists')
        seed = events[: boundary - FIRST_SEQ + 1]
        header.seed_length = len(seed)
        self._sessions[new_id] = _Session(
            header, options=source.options, events=list(seed), turns=turn_of(seed)
        )
        return len(seed)

    async def delete(self, session_id: str, answer: Answer | None = None) -> int:
        """Remove the session, its inbox and its request records."""
        count = len(self._get(session_id).events)
        del self._sessions[session_id]
        for key in [k for k, s in self._request_sessions.items() if s == session_id]:
            del self._requests[key], self._request_sessions[key], self._request_times[key]
        if answer is not None:
            record = answer(count)
            key = (record.agent_id, record.request_id)
            if key not in self._requests:
                self._requests[key] = record
                self._request_sessions[key] = ""
                self._request_times[key] = time.time_ns()
        return count

    async def session_requests(self, session_id: str) -> list[RequestRecord]:
        """The request records written with the session, with their times."""
        keys = sorted(k for k, s in self._request_sessions.items() if s == session_id)
        return [replace(self._requests[k], stored_ns=self._request_times[k]) for k in keys]

    async def mark_disposed(self, session_id: str, at_ns: int) -> None:
        """Record the disposal of the session's driver."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.disposed_ns = at_ns

    async def drop_requests(self, before_ns: int, limit: int) -> int:
        """Remove up to `limit` request records older than `before_ns`."""
        old = [k for k, t in self._request_times.items() if t < before_ns][:limit]
        for key in old:
            del self._requests[key], self._request_sessions[key], self._request_times[key]
        return len(old)

    async def reclaim(self) -> None:
        """Nothing to give back: removed objects are garbage."""

    async def try_lease(self, name: str) -> bool:
        """One process: the lease is always free."""
        return True

    async def release_lease(self, name: str) -> None:
        """Nothing to give back."""

    async def find_request(self, agent_id: str, request_id: str) -> RequestRecord | None:
        """The recorded answer of an earlier call, if any."""
        return self._requests.get((agent_id, request_id))

    async def request_ids(self, agent_id: str, limit: int) -> list[str] | None:
        """Every request id recorded for the agent; None when there are more than `limit`."""
        ids = [request_id for agent, request_id in self._requests if agent == agent_id]
        return ids if len(ids) <= limit else None

    async def wait_for_events(self, session_id: str, seconds: float) -> None:
        """One process: no other writer to hear from; wait the time out."""
        await asyncio.sleep(seconds)

    async def driven_by(self, agent_id: str) -> list[str]:
        """The sessions `agent_id` drove, the most recent first."""
        mine = [i for i, s in self._sessions.items() if s.driver == agent_id]
        return sorted(
            mine,
            key=lambda i: (self._sessions[i].header.create_time.ToNanoseconds(), i),
            reverse=True,
        )

    async def adopt_pending(self, agent_id: str, session_id: str) -> list[InboxEntry]:
        """Move the other sessions' inbox entries of `agent_id` here."""
        target = self._get(session_id)
        moved: list[InboxEntry] = []
        next_id = max(target.inbox, default=0) + 1

        def created(other_id: str) -> tuple[int, str]:
            return (self._sessions[other_id].header.create_time.ToNanoseconds(), other_id)

        for other_id in sorted(self._sessions, key=created):
            other = self._sessions[other_id]
            if other_id == session_id or other.driver != agent_id or not other.inbox:
                continue
            for key in sorted(other.inbox):
                entry = other.inbox[key]
                moved.append(InboxEntry(next_id, entry.kind, entry.message))
                next_id += 1
            other.inbox.clear()
        for entry in moved:
            target.inbox[entry.entry_id] = entry
        return moved

    def _get(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        return session


def _copy(options: agent_pb2.AgentOptions) -> agent_pb2.AgentOptions:
    """A copy, so that the caller's later changes never reach the store (as on disk)."""
    copy = agent_pb2.AgentOptions()
    copy.CopyFrom(options)
    return copy
