"""The turn-end flush: `session/flush` after the turn's events are stored.

Every event reaches the store through the journal's group commits as it is
appended; at every turn end (and on disposal) the loop awaits `flush`, which waits
for the session's writes to be durable and then runs the `session/flush` listeners
in parallel. The first failure is raised to the loop, which reports it as
`agent/error` and carries on.
"""

from __future__ import annotations

import asyncio
import inspect

from server.kernel.seams import Gather, GatherListener, SeamRegistry
from server.sessions.session import SessionLog

SESSION_FLUSH: Gather[SessionLog, None] = Gather("session/flush")
"""Called with the session once its turn's events are stored; a throw is reported."""


class Persistence:
    """Waits for a session's durability and runs the flush listeners."""

    def __init__(self, seams: SeamRegistry) -> None:
        self.seams = seams

    async def flush(self, session: SessionLog) -> None:
        """Wait until the session's writes are stored; run the `session/flush` listeners."""
        await session.settle()
        listeners = self.seams.listeners(SESSION_FLUSH, session.agent_id or None)
        if listeners:
            results = await asyncio.gather(
                *(_call(reg.fn, session) for reg in listeners), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result


async def _call(fn: GatherListener[SessionLog, None], session: SessionLog) -> None:
    result = fn(session)
    if inspect.isawaitable(result):
        await result
