"""The turn that answers a message, found by its request id, and its events.

`SendMessage` returns before the turn opens, and the turn that answers a message may
answer others too, or come after a turn already running. The message's `request_id`
is echoed on the event that records it (`user_message`; `steering_message` for a steer
that joined the running turn; `prompt_blocked` when a listener blocked it; or
`message_dropped` when a cancel dropped it), so the answering turn is the one that
holds that event. `Turn` reads the session from the `next_seq` the send returned,
keeps the events of the turn in progress until it knows whether it is ours, then
yields ours to its end. A broken stream is reopened from one past the last seq seen
(`SessionStream`): nothing is lost or repeated.

A turn reads its own stream, or a `SessionStream` shared by the turns of one
conversation (`Client.conversation`), so that a client sending message after message
opens one stream, not one per turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from agentloop.stream import RECONNECTS, RETRYABLE, SessionStream
from agentloop.v1 import session_event_pb2 as ev
from agentloop.view import TextDeltas, TurnView

if TYPE_CHECKING:
    from agentloop.v1.agent_event_pb2 import AgentEvent
    from agentloop.v1.agent_service_pb2_grpc import AgentServiceAsyncStub

__all__ = ["RECONNECTS", "RETRYABLE", "Turn"]

NAMING = frozenset(("user_message", "steering_message", "prompt_blocked", "message_dropped"))
"""The events that record a message, each with the `request_id` of its call."""


class Turn:
    """The turn answering one message: iterate it for its events, up to `turn_end`."""

    def __init__(
        self,
        agents: Callable[[], AgentServiceAsyncStub],
        agent_id: str,
        request_id: str,
        next_seq: int,
        *,
        stream: SessionStream | None = None,
    ) -> None:
        self._agents = agents
        self._shared = stream
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
        self.steering = False
        """For a steer: True when it joined the running turn (which answers it)."""
        self.on_agent_event: Callable[[AgentEvent], object] | None = None
        """Called with each live agent event read with the turn's events (its sub-agents'
        `child_progress`, status changes)."""
        self._seen: list[ev.SessionEvent] = []  # what `view()` needs: all but chunks

    def __aiter__(self) -> AsyncIterator[ev.SessionEvent]:
        return self.events()

    def _source(self) -> tuple[SessionStream, bool]:
        """The stream to read, and whether it is this turn's own (closed at the end).

        The shared stream serves when it has not gone past this turn's `next_seq`
        (events before it are skipped); otherwise the turn opens its own.
        """
        shared = self._shared
        if shared is not None and not shared.busy:
            if not shared.started:
                shared.cursor = max(shared.cursor, self.next_seq)
            if shared.position <= self.next_seq:
                return shared, False
        own = SessionStream(self._agents, agent_id=self.agent_id, from_seq=self.next_seq)
        return own, True

    async def events(self) -> AsyncIterator[ev.SessionEvent]:
        """The events of the answering turn, in order, ending with its `turn_end`.

        When the message was dropped, yields its `message_dropped` event and stops.
        """
        stream, own = self._source()
        reconnects = stream.reconnects
        stream.busy = True
        stream.on_agent_event = self.on_agent_event
        try:
            async for event in self._ours(stream):
                if event.WhichOneof("payload") != "assistant_chunk":
                    self._seen.append(event)
                yield event
        finally:
            stream.busy = False
            stream.on_agent_event = None
            self.reconnects += stream.reconnects - reconnects
            if own:
                stream.close()

    async def _ours(self, stream: SessionStream) -> AsyncIterator[ev.SessionEvent]:
        pending: list[ev.SessionEvent] = []  # the open turn, until we know it is ours
        ours = False
        while events := await stream.take():
            rest = len(events)
            try:
                for event in events:
                    rest -= 1
                    if event.seq < self.next_seq:
                        continue  # a shared stream: an earlier turn's, unread
                    kind = event.WhichOneof("payload")
                    if kind == "turn_start":
                        pending, ours = [event], False
                        continue
                    if not ours:
                        pending.append(event)
                        if kind in NAMING and getattr(event, kind).request_id == self.request_id:
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
            finally:  # what this turn did not consume stays for the next reader
                if rest:
                    stream.unread(events[-rest:])

    async def view(self) -> TurnView:
        """Read the turn to its end (what is left of it); its text, tool calls and usage."""
        if self.end is None and self.dropped is None:
            async for _ in self.events():
                pass
        return TurnView.of(self._seen)

    async def text_deltas(self) -> AsyncIterator[str]:
        """The turn's answer as it streams: text deltas only, never tool arguments."""
        deltas = TextDeltas()
        async for event in self.events():
            if text := deltas.of(event):
                yield text

    async def result(self) -> ev.SessionEvent:
        """Read the turn to its end; its `turn_end` (or the `message_dropped` event)."""
        if self.end is None and self.dropped is None:
            async for _ in self.events():
                pass
        found = self.end or self.dropped
        assert found is not None, "the stream ended before the turn did"
        return found
