"""The e2e fixtures: a real `App` on a real port, a client of it (the SDK's facade,
`agentloop.Client`), plugin processes, and the helpers that read what the server streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop import client as facade
from agentloop.stream import SessionStream
from agentloop.v1 import agent_event_pb2, session_event_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.edge.app import App
from server.observability.telemetry import Telemetry
from server.settings.config import Config
from tests.processes import PluginLauncher, plugin_launcher

if TYPE_CHECKING:
    from agentloop.v1.agent_service_pb2_grpc import AgentServiceAsyncStub

READ_TIMEOUT = 10.0
"""How long any single wait on the server may take before the test fails."""


@dataclass
class Client(facade.Client):
    """The SDK's client (its verbs, and the stubs `factory`, `agents`, `registry`) on a
    channel, with the health check."""

    async def health(self, service: str = "") -> int:
        """The health status of `service` ("" for the server as a whole)."""
        stub: Any = health_pb2_grpc.HealthStub(self.channel)  # the typeshed stub has no methods
        response = await stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=READ_TIMEOUT
        )
        return int(response.status)


@dataclass
class E2E(Client):
    """A running in-process server and a client connected to it."""

    app: App
    port: int

    @property
    def target(self) -> str:
        """host:port of the server."""
        return f"127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def running_app(config: Config, telemetry: Telemetry | None = None) -> AsyncIterator[E2E]:
    """Start an `App` with `config` (whose `listen` is a loopback address) and connect to it;
    on exit close the channel and stop the app."""
    app = App(config, telemetry=telemetry)
    port = await app.start()
    assert port > 0
    channel = facade.connect(f"127.0.0.1:{port}").channel
    try:
        yield E2E(app=app, port=port, channel=channel)
    finally:
        await channel.close()
        await app.stop(grace=0)


@pytest.fixture
async def e2e() -> AsyncIterator[E2E]:
    """A real server on 127.0.0.1:0 with no start-up agents and a memory store."""
    async with running_app(Config(listen="127.0.0.1:0", store="memory", agents=())) as running:
        yield running


@pytest.fixture
def without_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """No agentloop token in the environment: each test chooses its own."""
    monkeypatch.delenv("AGENTLOOP_TOKEN", raising=False)
    monkeypatch.delenv("AGENTLOOP_PLUGIN_TOKEN", raising=False)


@pytest.fixture
async def launcher(tmp_path: Path) -> AsyncIterator[PluginLauncher]:
    """Plugin processes for one test, killed at its end."""
    async with plugin_launcher(tmp_path) as launch:
        yield launch


async def read_turn(
    agent_stub: AgentServiceAsyncStub,
    agent_id: str,
    from_seq: int,
    metadata: Sequence[tuple[str, str]] | None = None,
) -> list[session_event_pb2.SessionEvent]:
    """Stream the session events of `agent_id` from `from_seq` up to the first `turn_end`.

    Read with the SDK's `SessionStream`, which reconnects a broken stream. Live agent
    events on the stream are skipped. Fails (TimeoutError) after 10 seconds instead of
    hanging, and when the stream ends before a `turn_end`. `metadata` goes with the
    call (a bearer token, say).
    """
    events: list[session_event_pb2.SessionEvent] = []
    stream = SessionStream(
        lambda: agent_stub, agent_id=agent_id, from_seq=from_seq, metadata=metadata
    )
    try:
        async with asyncio.timeout(READ_TIMEOUT):
            async for event in stream:
                events.append(event)
                if event.WhichOneof("payload") == "turn_end":
                    return events
    finally:
        stream.close()
    kinds_seen = [e.WhichOneof("payload") for e in events]
    raise AssertionError(f"the stream ended before a turn_end; it carried {kinds_seen}")


def kinds(events: list[session_event_pb2.SessionEvent]) -> list[str]:
    """The payload kind of each event."""
    return [str(e.WhichOneof("payload")) for e in events]


def of_kind(
    events: Sequence[session_event_pb2.SessionEvent], kind: str
) -> list[session_event_pb2.SessionEvent]:
    """The events whose payload is `kind`."""
    return [e for e in events if e.WhichOneof("payload") == kind]


def text_of(blocks: Sequence[object]) -> str:
    """The concatenated text blocks of some content."""
    return "".join(b.text.text for b in blocks if b.WhichOneof("block") == "text")  # type: ignore[attr-defined]


class EventStream:
    """One `StreamSessionEvents` call, read a batch at a time, each read bounded.

    Every batch is recorded: session events in `events`, live agent events in
    `agent_events`. `until` and `until_agent_event` consume what was recorded before
    reading more, so nothing read in a batch is skipped. Used as a context manager, it
    disconnects on exit.
    """

    def __init__(
        self,
        agent_stub: AgentServiceAsyncStub,
        *,
        agent_id: str = "",
        session_id: str = "",
        from_seq: int = 0,
        replay_only: bool = False,
    ) -> None:
        self.call = agent_stub.StreamSessionEvents(
            api.StreamSessionEventsRequest(
                # `selector` is a oneof: setting both (even one empty) keeps the last.
                **({"agent_id": agent_id} if agent_id else {"session_id": session_id}),
                from_seq=from_seq,
                replay_only=replay_only,
            )
        )
        self.events: list[session_event_pb2.SessionEvent] = []
        self.agent_events: list[agent_event_pb2.AgentEvent] = []
        self.ended = False
        self._seen = 0
        self._seen_agent = 0

    async def next(self) -> api.StreamSessionEventsResponse | None:
        """The next batch, or None when the stream ended; TimeoutError after 10 s."""
        async with asyncio.timeout(READ_TIMEOUT):
            item = await self.call.read()
        if item is grpc.aio.EOF:
            self.ended = True
            return None
        assert isinstance(item, api.StreamSessionEventsResponse)
        self.events.extend(item.events)
        self.agent_events.extend(item.agent_events)
        return item

    async def until(self, kind: str) -> session_event_pb2.SessionEvent:
        """Read until a session event whose payload is `kind`; returns it."""
        while True:
            while self._seen < len(self.events):
                event = self.events[self._seen]
                self._seen += 1
                if event.WhichOneof("payload") == kind:
                    return event
            if await self.next() is None:
                raise AssertionError(f"the stream ended before a {kind}; saw {kinds(self.events)}")

    async def until_agent_event(
        self, predicate: Callable[[agent_event_pb2.AgentEvent], bool]
    ) -> agent_event_pb2.AgentEvent:
        """Read until a live agent event satisfying `predicate`; returns it."""
        while True:
            while self._seen_agent < len(self.agent_events):
                event = self.agent_events[self._seen_agent]
                self._seen_agent += 1
                if predicate(event):
                    return event
            if await self.next() is None:
                raise AssertionError(f"the stream ended first; agent events: {self.agent_events}")

    async def drain(self) -> None:
        """Read until the stream ends by itself (bounded per item)."""
        while await self.next() is not None:
            pass

    def close(self) -> None:
        """Disconnect."""
        self.call.cancel()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
