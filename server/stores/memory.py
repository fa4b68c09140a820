"""An in-memory session store: sessions live as long as the server process."""

from __future__ import annotations

from collections.abc import Sequence

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.errors import AlreadyExists, NotFound
from server.stores import SessionSummary


class MemoryStore:
    """Sessions in a dict, for the life of the process.

    A server started with `store: memory` keeps no sessions across restarts and says
    so (`persistent` is False: resume is refused). Tests pass `persistent=True` to
    exercise resume without a file.
    """

    def __init__(self, *, persistent: bool = False) -> None:
        self.persistent = persistent
        self._sessions: dict[str, tuple[session_pb2.SessionHeader, list[ev.SessionEvent]]] = {}

    async def create(self, session_id: str, header: session_pb2.SessionHeader) -> None:
        """Record a new session."""
        if session_id in self._sessions:
            raise AlreadyExists(f'session "{session_id}" already exists')
        self._sessions[session_id] = (header, [])

    async def append(self, session_id: str, events: Sequence[ev.SessionEvent]) -> None:
        """Add events after the stored ones."""
        stored = self._sessions[session_id][1]
        for event in events:
            if event.seq != len(stored):
                raise ValueError(f"session {session_id}: event {event.seq} after {len(stored)}")
            stored.append(event)

    async def exists(self, session_id: str) -> bool:
        """Whether the session is stored."""
        return session_id in self._sessions

    async def load(
        self, session_id: str
    ) -> tuple[session_pb2.SessionHeader, list[ev.SessionEvent]]:
        """The header and events of a session."""
        if session_id not in self._sessions:
            raise NotFound(f'session "{session_id}" not found')
        header, events = self._sessions[session_id]
        return header, list(events)

    async def summary(self, session_id: str) -> SessionSummary:
        """The header and counts of a session."""
        header, events = await self.load(session_id)
        turns = max((e.turn_start.turn for e in events if e.HasField("turn_start")), default=0)
        return SessionSummary(header, len(events), turns)

    async def open(self) -> None:
        """Nothing to open."""

    async def close(self) -> None:
        """Nothing to release."""

    async def list_ids(self) -> list[str]:
        """Every session id, sorted."""
        return sorted(self._sessions)
