"""Session stores: where session logs are kept between turns and across restarts.

The loop writes to a store at every turn-end flush; a store never sees an event
twice. Reads return the stored events in sequence order; a session that cannot be
read raises `SessionDamaged`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2


@dataclass(frozen=True)
class SessionSummary:
    """What a listing needs of a stored session, without its events."""

    header: session_pb2.SessionHeader
    event_count: int
    turn_count: int


class SessionStore(Protocol):
    """A place to keep sessions."""

    persistent: bool
    """Whether sessions survive a restart of the server."""

    async def create(self, session_id: str, header: session_pb2.SessionHeader) -> None:
        """Record a new session and its header; raises `AlreadyExists` if it exists."""
        ...

    async def append(self, session_id: str, events: Sequence[ev.SessionEvent]) -> None:
        """Durably add events that follow the ones stored."""
        ...

    async def exists(self, session_id: str) -> bool:
        """Whether the session is stored."""
        ...

    async def load(
        self, session_id: str
    ) -> tuple[session_pb2.SessionHeader, list[ev.SessionEvent]]:
        """The header and every event; raises `NotFound` if the session is unknown."""
        ...

    async def summary(self, session_id: str) -> SessionSummary:
        """The header and counts; raises `NotFound` if the session is unknown."""
        ...

    async def list_ids(self) -> list[str]:
        """Every stored session id, sorted."""
        ...

    async def open(self) -> None:
        """Open the store now (creating it if needed) rather than on first use."""
        ...

    async def close(self) -> None:
        """Release the store's resources."""
        ...
