"""Direct writes to a session store, for tests that build a store's state by hand."""

from __future__ import annotations

from collections.abc import Sequence

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.stores import Commit, SessionStore, SessionWrites


async def create_session(
    store: SessionStore, session_id: str, header: session_pb2.SessionHeader
) -> None:
    """Store a new session with `header`, as the factory does."""
    await store.commit(Commit({session_id: SessionWrites(create=header)}))


async def append_events(
    store: SessionStore, session_id: str, events: Sequence[ev.SessionEvent]
) -> None:
    """Store `events` after the stored ones, as the journal does."""
    await store.commit(Commit({session_id: SessionWrites(events=list(events))}))
