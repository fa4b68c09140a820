"""A session's events from a sequence number, across reconnects.

`StreamSessionEvents` delivers a session's events in order from `from_seq`; when the
connection breaks, a new call from one past the last seq received continues exactly
where the old one ended (the contract: nothing lost, nothing repeated). `SessionStream`
does that for its reader, a batch or an event at a time. Live agent events (on a stream
by agent id) are not replayed by a reconnect: those of the gap are lost, as they would
be for a slow reader, and `dropped_agent_events` counts only what the server reported.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from agentloop.errors import error_from
from agentloop.retrying import MAX_ATTEMPTS, retry_delay
from agentloop.v1 import agent_event_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev

if TYPE_CHECKING:
    from agentloop.v1 import agent_event_pb2
    from agentloop.v1.agent_service_pb2_grpc import AgentServiceAsyncStub

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
"""Stream failures a reconnect may cure (a dropped connection, a server restart)."""

RECONNECTS = 8
"""Consecutive failed reconnects before the error reaches the caller."""

MAX_BACKOFF = 2.0
"""The longest wait, in seconds, before reconnecting after a failure the server did not time."""


class SessionStream:
    """One session's events from `from_seq`, reopened after a failure where it broke.

    Read it a batch at a time (`batches()`, `next_batch()`) or an event at a time
    (`async for event in stream`, `next_event()`), not both. The call opens on the first
    read; `close()` ends it (a stream by agent id follows the agent until it is
    disposed, so a reader that stops early closes it).
    """

    def __init__(
        self,
        agents: Callable[[], AgentServiceAsyncStub],
        *,
        agent_id: str = "",
        session_id: str = "",
        from_seq: int = 0,
        replay_only: bool = False,
        metadata: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        if bool(agent_id) == bool(session_id):
            raise ValueError("SessionStream needs exactly one of agent_id or session_id")
        self._agents = agents
        self.agent_id = agent_id
        self.session_id = session_id
        self.replay_only = replay_only
        self.metadata = metadata
        self.cursor = from_seq
        """The seq the next call starts from: one past the last event received."""
        self.reconnects = 0
        """How many times the call was reopened after a failure."""
        self.dropped_agent_events = 0
        """Live agent events the server dropped for this reader (its counts, summed)."""
        self.ended = False
        """True once the server ended the stream (replay done, or the agent disposed)."""
        self.batches_read = 0
        """Responses read so far, over every call."""
        self.calls = 0
        """`StreamSessionEvents` calls opened (the first, then one per reconnect)."""
        self.busy = False
        """True while a `Turn` reads it (a second turn then opens its own stream)."""
        self.started = False
        """True once a call was opened (before that, `cursor` may still be moved)."""
        self.on_agent_events: Callable[[Sequence[agent_event_pb2.AgentEvent]], None] | None = None
        """Hears each response's live agent events, before its session events are read."""
        self.on_agent_event: Callable[[agent_event_pb2.AgentEvent], object] | None = None
        """Called with each live agent event as its batch is read (a sub-agent's progress)."""
        self._call: Any = None
        self._held: deque[ev.SessionEvent] = deque()

    @property
    def position(self) -> int:
        """The seq of the next event `next_event()` returns (at the earliest)."""
        return self._held[0].seq if self._held else self.cursor

    def _open(self) -> Any:
        self.started = True
        self.calls += 1
        request = api.StreamSessionEventsRequest(from_seq=self.cursor, replay_only=self.replay_only)
        if self.agent_id:  # `selector` is a oneof: set only the one given
            request.agent_id = self.agent_id
        else:
            request.session_id = self.session_id
        return self._agents().StreamSessionEvents(request, metadata=self.metadata)

    async def next_batch(self) -> api.StreamSessionEventsResponse | None:
        """The next response; None once the server ended the stream.

        The first response of each call confirms the subscription and carries no events.
        A stream ended `AGENT_MOVING` or `STORE_UNAVAILABLE` (an agent between replicas,
        a database away) is reopened after the server's `RetryInfo` delay, jittered, and
        such waits do not use up the `RECONNECTS`; other failures back off on their own.
        """
        failures = 0
        moves = 0
        while not self.ended:
            if self._call is None:
                self._call = self._open()
            try:
                batch = await self._call.read()
            except grpc.aio.AioRpcError as error:
                self._call = None
                told = retry_delay(error)
                if told is not None and moves < MAX_ATTEMPTS:
                    moves += 1
                    self.reconnects += 1
                    await asyncio.sleep(told * random.uniform(0.5, 1.0))  # jitter, as unary calls
                    continue
                if error.code() not in RETRYABLE or failures >= RECONNECTS:
                    raise error_from(error) from None
                failures += 1
                self.reconnects += 1
                await asyncio.sleep(min(0.05 * 2**failures, MAX_BACKOFF))
                continue
            if batch is grpc.aio.EOF:
                self._call = None
                self.ended = True
                return None
            assert isinstance(batch, api.StreamSessionEventsResponse)
            self.batches_read += 1
            if batch.events:
                self.cursor = batch.events[-1].seq + 1
            self.dropped_agent_events += batch.dropped_agent_events
            if batch.agent_events and self.on_agent_events is not None:
                self.on_agent_events(batch.agent_events)
            if self.on_agent_event is not None:
                for agent_event in batch.agent_events:
                    self.on_agent_event(agent_event)
            return batch
        return None

    async def batches(self) -> AsyncIterator[api.StreamSessionEventsResponse]:
        """Every response, across reconnects, until the server ends the stream."""
        while (batch := await self.next_batch()) is not None:
            yield batch

    async def next_event(self) -> ev.SessionEvent | None:
        """The next session event; None once the server ended the stream."""
        while not self._held:
            batch = await self.next_batch()
            if batch is None:
                return None
            self._held.extend(batch.events)
        return self._held.popleft()

    async def take(self) -> list[ev.SessionEvent]:
        """Every event read and not yet taken, reading a batch when there is none.

        An empty list once the server ended the stream; `unread` gives back a tail.
        """
        while not self._held:
            batch = await self.next_batch()
            if batch is None:
                return []
            self._held.extend(batch.events)
        events = list(self._held)
        self._held.clear()
        return events

    def unread(self, events: list[ev.SessionEvent]) -> None:
        """Give back the unconsumed tail of what `take` returned (the next reads see it)."""
        self._held.extendleft(reversed(events))

    def __aiter__(self) -> AsyncIterator[ev.SessionEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ev.SessionEvent]:
        while (event := await self.next_event()) is not None:
            yield event

    def close(self) -> None:
        """End the call (a later read opens a new one from `cursor`)."""
        if self._call is not None:
            self._call.cancel()
            self._call = None
