"""The turn-end flush: the durability boundary of a session.

At every turn end (and after an idle injection, and on disposal) the loop awaits
`flush`: the events appended since the last flush are written to the store, and the
`session/flush` listeners run in parallel. The first failure is raised to the loop,
which reports it as `agent/error` and carries on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from server.seams import SeamRegistry
from server.session import SessionLog
from server.stores import SessionStore

SESSION_FLUSH = "session/flush"


class Persistence:
    """Writes each session's new events to the store, once each, in order."""

    def __init__(self, store: SessionStore, seams: SeamRegistry) -> None:
        self.store = store
        self.seams = seams
        self._flushed: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def track(self, session: SessionLog, stored: int) -> None:
        """Start tracking `session`, whose first `stored` events are already stored."""
        self._flushed[session.session_id] = stored
        self._locks[session.session_id] = asyncio.Lock()

    def forget(self, session: SessionLog) -> None:
        """Stop tracking `session` (after its final flush)."""
        self._flushed.pop(session.session_id, None)
        self._locks.pop(session.session_id, None)

    async def flush(self, session: SessionLog) -> None:
        """Store the unflushed events and run the `session/flush` listeners."""
        lock = self._locks.get(session.session_id)
        if lock is not None:
            async with lock:
                start = self._flushed[session.session_id]
                pending = session.events[start:]
                if pending:
                    await self.store.append(session.session_id, pending)
                    self._flushed[session.session_id] = start + len(pending)
        listeners = self.seams.listeners(SESSION_FLUSH, session.agent_id or None)
        if listeners:
            results: list[Any] = await asyncio.gather(
                *(_call(reg.fn, session) for reg in listeners), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result


async def _call(fn: Any, session: SessionLog) -> None:
    result = fn(session)
    if asyncio.iscoroutine(result):
        await result
