"""StreamAgentEvents: every agent's live events and turn ends, server-wide, through a
real server over gRPC (the SDK's verb) and as server-sent events on the HTTP side."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_factory_service_pb2 as fac
from server.kernel import seams as S
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, running_app
from tests.e2e.subagents import create, says, scripted, send, session_events, wait_idle

T = READ_TIMEOUT

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one server, one event loop


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served() -> AsyncIterator[E2E]:
    """One server with its HTTP side for the module."""
    config = Config(listen="127.0.0.1:0", http_listen="127.0.0.1:0", store="memory", agents=())
    async with running_app(config) as running:
        yield running


def kinds(responses: list[fac.StreamAgentEventsResponse], agent_id: str) -> list[str]:
    """What happened to `agent_id`, in order: event kinds, and `turn_end:<reason>`."""
    found: list[tuple[int, int, str]] = []
    for index, response in enumerate(responses):
        for event in response.events:
            if event.agent_id == agent_id:
                kind = str(event.WhichOneof("event"))
                if kind == "status":
                    kind = f"status:{ae.AgentStatus.Name(event.status.status)}"
                found.append((index, 0, kind))
        for end in response.turn_ends:
            if end.agent_id == agent_id:
                reason = end.event.turn_end.reason.WhichOneof("kind")
                found.append((index, 1, f"turn_end:{reason}"))
    return [kind for _, _, kind in found]


def listeners(e2e: E2E) -> int:
    """The in-process listeners on the feed's seams (any agent sees them)."""
    seams = e2e.app.factory.runtime.seams
    return len(seams.listeners(S.AGENT_EVENT, "x")) + len(seams.listeners(S.SESSION_COMMITTED, "x"))


async def test_one_stream_follows_every_agent_and_each_turn_end(served: E2E) -> None:
    before = listeners(served)
    responses: list[fac.StreamAgentEventsResponse] = []
    stream = served.stream_agent_events()
    first = await anext(stream)
    assert first.subscribed and not first.events and not first.turn_ends
    assert listeners(served) == before + 2

    async def read_until_disposed(agent_id: str) -> None:
        async for response in stream:
            responses.append(response)
            if any(e.agent_id == agent_id and e.HasField("disposed") for e in response.events):
                return

    reading = asyncio.ensure_future(asyncio.wait_for(read_until_disposed("w2"), T))
    for agent_id in ("w1", "w2"):  # two agents, one stream
        await create(served, agent_id, scripted(says(f"hello from {agent_id}")))
        await send(served, agent_id)
        await wait_idle(served, agent_id)
    await served.dispose("w1")
    await served.dispose("w2")
    await reading
    for agent_id in ("w1", "w2"):
        seen = kinds(responses, agent_id)
        assert seen[0] == "created" and seen[-1] == "disposed", seen
        assert seen.index("status:AGENT_STATUS_RUNNING") < seen.index("turn_end:completed")
        assert seen.count("turn_end:completed") == 1
    # The turn end is the stored event, with its agent's session.
    [end] = [t for r in responses for t in r.turn_ends if t.agent_id == "w1"]
    stored = await session_events(served, end.session_id)
    assert stored[-1] == end.event and end.session_id.startswith("w1-session-")
    await stream.aclose()  # the client leaves: the server drops its listeners
    for _ in range(200):
        if listeners(served) == before:
            break
        await asyncio.sleep(0.02)
    assert listeners(served) == before


async def sse_messages(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a server-sent event stream."""
    kind, data = "message", ""
    async for line in lines:
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line.startswith("id: "):
            raise AssertionError(f"an agent event stream has no ids: {line}")
        elif not line and data:
            yield kind, json.loads(data)
            kind, data = "message", ""


async def test_the_stream_as_server_sent_events(served: E2E) -> None:
    assert served.app.http is not None
    base = f"http://127.0.0.1:{served.app.http.port}"
    async with (
        httpx.AsyncClient(base_url=base, timeout=T) as client,
        client.stream(
            "POST", "/api/agentloop.v1.AgentFactoryService/StreamAgentEvents", json={}
        ) as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["content-type"] == "text/event-stream"
        messages = sse_messages(stream.aiter_lines())
        assert await anext(messages) == ("message", {"subscribed": True})
        await create(served, "over-http", scripted(says("hi")))
        await send(served, "over-http")

        async def until_turn_end() -> list[dict[str, Any]]:
            seen: list[dict[str, Any]] = []
            async for kind, data in messages:
                assert kind == "message"
                seen.append(data)
                if any(t["agentId"] == "over-http" for t in data.get("turnEnds", [])):
                    return seen
            raise AssertionError("the stream ended")

        seen = await asyncio.wait_for(until_turn_end(), T)
        events = [e for d in seen for e in d.get("events", []) if e["agentId"] == "over-http"]
        assert "created" in events[0]
        [end] = [t for d in seen for t in d.get("turnEnds", [])]
        assert "completed" in end["event"]["turnEnd"]["reason"]
    await wait_idle(served, "over-http")
    await served.dispose("over-http")
