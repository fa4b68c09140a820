"""The inbox: the queued and steering FIFOs of one agent, and the driver's wake-up.

Each item mirrors an entry of the session's durable inbox (`entry_id`): the entry is
removed in the same commit as the event that records the message (`user/message`,
`prompt/blocked`, `steering/message`, `message/dropped`), so after a crash every
accepted message is recorded or still pending.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from agentloop.v1 import content_pb2 as c


@dataclass(frozen=True)
class QueuedMessage:
    """A message accepted by send or steer, with its resolved source."""

    content: list[c.ContentBlock]
    source: c.Source
    entry_id: int = 0
    """Its durable inbox entry; 0 for a message no client sent (a continuation reason)."""
    request_id: str = ""
    steering: bool = False
    """Accepted as steering of a running turn."""

    @property
    def consumes(self) -> tuple[int, ...]:
        """The inbox entries the event recording this message removes."""
        return (self.entry_id,) if self.entry_id else ()


class Inbox:
    """Two FIFOs: `queued` opens turns, `steering` joins the running one."""

    def __init__(self) -> None:
        self.queued: deque[QueuedMessage] = deque()
        self.steering: deque[QueuedMessage] = deque()
        self._wake = asyncio.Event()

    def enqueue(self, item: QueuedMessage) -> None:
        """Queue a message for the next turn and wake the driver."""
        self.queued.append(item)
        self._wake.set()

    def steer(self, item: QueuedMessage) -> None:
        """Add steering for the running turn (no wake-up: the turn drains it)."""
        self.steering.append(item)

    def drain_queued(self) -> list[QueuedMessage]:
        """Take every queued message (a turn answers all of them)."""
        items = list(self.queued)
        self.queued.clear()
        return items

    def drain_steering(self) -> list[QueuedMessage]:
        """Take every steering item."""
        items = list(self.steering)
        self.steering.clear()
        return items

    def clear(self) -> None:
        """Drop both FIFOs (cancel)."""
        self.queued.clear()
        self.steering.clear()

    def wake(self) -> None:
        """Wake the driver without queuing anything (disposal)."""
        self._wake.set()

    async def wait(self) -> None:
        """Wait until something is queued or `wake()` is called."""
        while not self.queued:
            self._wake.clear()
            if self.queued:
                return
            await self._wake.wait()
            if not self.queued:
                return  # woken for disposal
