"""Session stores: where session logs are kept between turns and across restarts.

The loop writes to a store at every turn-end flush; a store never sees an event
twice. Reads return the stored events in sequence order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2


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

    async def list_ids(self) -> list[str]:
        """Every stored session id, sorted."""
        ...
