"""The StreamAgentEvents RPC of `AgentFactoryService` (mixed into its servicer).

Every agent's live events and turn ends, server-wide: in-process listeners on the
`agent/event` and `session/committed` seams, registered only while a stream is open
(a server nobody watches this way pays nothing for it). Both seams fire once what they
report is stored, so a turn end is never shown before its events can be read.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_factory_service_pb2 as pb
from server.kernel import seams as S
from server.lifecycle.factory import AgentFactory
from server.loop.agent import Agent

Context = grpc.aio.ServicerContext[Any, Any]

FEED_BUFFER = 4096
"""Events and turn ends held for a slow reader; older ones are dropped first."""

COALESCE_PASSES = 2
"""Loop passes a woken stream lets run before it answers: what one commit set going
(a turn's end, then the status change it brings) goes out in one response."""

Item = ae.AgentEvent | pb.AgentTurnEnd


class AgentFeed:
    """One stream's buffer: what the listeners saw since its last response."""

    def __init__(self) -> None:
        self.items: deque[Item] = deque(maxlen=FEED_BUFFER)
        self.dropped = 0
        self.arrived = asyncio.Event()

    def agent_event(self, seen: S.AgentEventSeen) -> None:
        """An `agent/event` listener: every live agent event."""
        self._push(seen.event)

    def committed(self, seen: S.SessionEventSeen) -> None:
        """A `session/committed` listener: the stored turn ends."""
        event = seen.event
        if not event.HasField("turn_end"):
            return
        agent = seen.agent
        session_id = agent.session.session_id if isinstance(agent, Agent) else ""
        self._push(pb.AgentTurnEnd(agent_id=agent.agent_id, session_id=session_id, event=event))

    def _push(self, item: Item) -> None:
        if len(self.items) == self.items.maxlen:
            self.dropped += 1  # the append below pushes out the oldest
        self.items.append(item)
        self.arrived.set()

    def take(self) -> pb.StreamAgentEventsResponse:
        """Everything since the last response, as one response; the buffer empties."""
        response = pb.StreamAgentEventsResponse(dropped_events=self.dropped)
        for item in self.items:
            if isinstance(item, ae.AgentEvent):
                response.events.append(item)
            else:
                response.turn_ends.append(item)
        self.items.clear()
        self.dropped = 0
        self.arrived.clear()
        return response


class AgentFeedMethods:
    """Follow every agent of the server (mixed into the AgentFactoryService servicer)."""

    factory: AgentFactory

    async def StreamAgentEvents(
        self, request: pb.StreamAgentEventsRequest, context: Context
    ) -> AsyncIterator[pb.StreamAgentEventsResponse]:
        """Confirm the subscription, then answer each batch of events as it comes."""
        feed = AgentFeed()
        seams = self.factory.runtime.seams
        disposers = [
            seams.on(S.AGENT_EVENT, feed.agent_event, name="StreamAgentEvents"),
            seams.on(S.SESSION_COMMITTED, feed.committed, name="StreamAgentEvents"),
        ]
        try:
            yield pb.StreamAgentEventsResponse(subscribed=True)
            while True:
                await feed.arrived.wait()
                for _ in range(COALESCE_PASSES):
                    await asyncio.sleep(0)
                yield feed.take()
        finally:
            for dispose in disposers:
                dispose()
