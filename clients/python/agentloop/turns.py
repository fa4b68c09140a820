"""The turn that answers a message, found by its request id, and its events.

`SendMessage` returns before the turn opens, and the turn that answers a message may
answer others too, or come after a turn already running. The message's `request_id`
is echoed on the `user_message` event that records it (or on `message_dropped` when a
cancel dropped it), so the answering turn is the one that holds that event. `Turn`
streams the session from the `next_seq` the send returned, keeps the events of the
turn in progress until it knows whether it is ours, then yields ours to its end. A
broken stream is reopened from one past the last seq seen: nothing is lost or repeated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev

if TYPE_CHECKING:
    from agentloop.v1.agent_service_pb2_grpc import AgentServiceAsyncStub

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
"""Stream failures a reconnect may cure (a dropped connection, a server restart)."""

RECONNECTS = 8
"""Consecutive failed reconnects before the error reaches the caller."""


class Turn:
    """The turn answering one message: iterate it for its events, up to `turn_end`."""

    def __init__(
        self,
        agents: Callable[[], AgentServiceAsyncStub],
        agent_id: str,
        request_id: str,
        next_seq: int,
    ) -> None:
        self._agents = agents
        self.agent_id = agent_id
        self.request_id = request_id
        self.next_seq = next_seq
        """Where the answering turn's events start, at the earliest."""
        self.end: ev.SessionEvent | None = None
        """The `turn_end` of the turn, once it was read."""
        self.dropped: ev.SessionEvent | None = None
        """The `message_dropped` event, when a cancel dropped the message instead."""
        self.reconnects = 0
        """How many times the stream was reopened after a failure."""

    def __aiter__(self) -> AsyncIterator[ev.SessionEvent]:
        return self.events()

    async def events(self) -> AsyncIterator[ev.SessionEvent]:
        """The events of the answering turn, in order, ending with its `turn_end`.

        When the message was dropped, yields its `message_dropped` event and stops.
        """
        pending: list[ev.SessionEvent] = []  # the open turn, until we know it is ours
        ours = False
        async for event in self._stream():
            kind = event.WhichOneof("payload")
            if kind == "turn_start":
                pending, ours = [event], False
                continue
            if not ours:
                pending.append(event)
                if self._names_us(event, kind):
                    if kind == "message_dropped":
                        self.dropped = event
                        yield event
                        return
                    ours = True
                    for held in pending:
                        yield held
                    pending = []
                elif kind == "turn_end":
                    pending = []
                continue
            yield event
            if kind == "turn_end":
                self.end = event
                return

    async def result(self) -> ev.SessionEvent:
        """Read the turn to its end; its `turn_end` (or the `message_dropped` event)."""
        async for _ in self.events():
            pass
        found = self.end or self.dropped
        assert found is not None, "the stream ended before the turn did"
        return found

    def _names_us(self, event: ev.SessionEvent, kind: str | None) -> bool:
        if kind == "user_message":
            return event.user_message.request_id == self.request_id
        if kind == "message_dropped":
            return event.message_dropped.request_id == self.request_id
        return False

    async def _stream(self) -> AsyncIterator[ev.SessionEvent]:
        """The session's events from `next_seq`, across reconnects."""
        cursor = self.next_seq
        failures = 0
        while True:
            request = api.StreamSessionEventsRequest(agent_id=self.agent_id, from_seq=cursor)
            call: Any = self._agents().StreamSessionEvents(request)
            try:
                async for batch in call:
                    failures = 0
                    for event in batch.events:
                        cursor = event.seq + 1
                        yield event
                return  # the agent was disposed and its log drained
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRYABLE or failures >= RECONNECTS:
                    raise
                failures += 1
                self.reconnects += 1
                await asyncio.sleep(min(0.05 * 2**failures, 2.0))
            finally:
                call.cancel()
