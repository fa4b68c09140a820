"""Hostile sizes through a real server: templates stay linear, and every limit is refused
with a status (or a turn end) that names it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from google.protobuf import duration_pb2

from agentloop.stream import SessionStream
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.limits import Limits
from server.kernel.tools import ToolExecution, ToolValue
from server.models.scripted_options import script_options
from server.settings.config import Config
from tests.e2e.conftest import (
    E2E,
    READ_TIMEOUT,
    Client,
    EventStream,
    of_kind,
    read_turn,
    running_app,
    text_of,
)
from tests.processes import server_process, token_free_env
from tests.tool_helpers import make_tool

T = READ_TIMEOUT
T_ = TypeVar("T_")


def scripted(*steps: scripted_pb2.ScriptedStep, persona: str = "") -> agent_pb2.AgentOptions:
    """Options of a scripted agent."""
    return agent_pb2.AgentOptions(
        provider="scripted", model="m", provider_options=script_options(steps), persona=persona
    )


@pytest.fixture
async def small() -> AsyncIterator[E2E]:
    """A server with small limits, so that each can be reached cheaply."""
    limits = Limits(
        max_content_bytes=1000,
        max_persona_bytes=2 * 1024 * 1024,
        max_script_steps=3,
        max_script_tool_calls=4,
        max_agents=3,
        max_tool_calls_per_step=2,
        max_events_per_turn=300,
        max_streams=2,
        max_pending_messages=2,
    )
    config = Config(listen="127.0.0.1:0", store="memory", agents=(), limits=limits)
    async with running_app(config) as running:
        yield running


async def refused(call: object, code: grpc.StatusCode) -> str:
    """Await `call`, expect `code`; returns the details."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""


@contextlib.asynccontextmanager
async def server_in_a_process(tmp_path: Path) -> AsyncIterator[Client]:
    """A `python -m server` process (a blocked event loop there cannot hide behind the
    test's own loop), with room for a 1 MB persona; a client connected to it."""
    config = tmp_path / "config.yaml"
    config.write_text("store: memory\nagents: []\nlimits:\n  maxPersonaBytes: 2097152\n")
    async with server_process(
        "--config", str(config), "--listen", "127.0.0.1:0",
        stderr_path=tmp_path / "server.log", env=token_free_env(),
    ) as server:  # fmt: skip
        address = await server.listening_address()
        async with grpc.aio.insecure_channel(address) as channel:
            yield Client(channel)


async def healthy_while(client: Client, work: Awaitable[T_]) -> T_:
    """Run `work` while checking health back to back, each answered SERVING; its result."""
    task = asyncio.ensure_future(work)
    while not task.done():
        assert await client.health() == 1  # SERVING
    return await task


async def test_a_1_mb_hostile_persona_is_checked_and_rendered_literally_with_health_answering(
    tmp_path: Path,
) -> None:
    # Quadratic scanning took hours at this size: the calls' deadline `T` catches that.
    # How long a linear check holds the event loop is a timing, and not asserted here.
    hostile = "{{" * 500_000
    async with server_in_a_process(tmp_path) as client:
        request = fac.CreateAgentRequest(agent_id="h", options=scripted(persona=hostile))
        await healthy_while(client, client.factory.CreateAgent(request, timeout=T))
        # Each step renders the persona again: a turn runs with health still answering.
        await client.agents.SendMessage(api.SendMessageRequest(agent_id="h", text="hi"))
        events = await healthy_while(client, read_turn(client.agents, "h", 0))
    end = events[-1].turn_end.reason
    assert end.WhichOneof("kind") == "completed", end
    header = next(e for e in events if e.HasField("request_header"))
    assert hostile in header.request_header.header.system  # a lone `{{` is literal


async def stored_count(client: Client, agent_id: str) -> int:
    """How many events of the agent's session the server has stored."""
    request = api.GetSessionRequest(agent_id=agent_id)
    return (await client.agents.GetSession(request, timeout=T)).session.event_count


async def health_between_counts(
    client: Client, agent_id: str, work: Awaitable[T_]
) -> tuple[T_, list[tuple[int, int]]]:
    """Run `work` while probing back to back: the stored event count, a health check, the
    count again. Returns its result and, per health check, the counts the server gave
    just before the check was sent and just after it was answered."""
    task = asyncio.ensure_future(work)
    probes: list[tuple[int, int]] = []
    while not task.done():
        before = await stored_count(client, agent_id)
        assert await client.health() == 1  # SERVING
        probes.append((before, await stored_count(client, agent_id)))
    return await task, probes


async def whole_turn(client: Client, agent_id: str) -> list[ev.SessionEvent]:
    """The agent's session events up to the first `turn_end`, however long they take."""
    stream = SessionStream(lambda: client.agents, agent_id=agent_id)
    events: list[ev.SessionEvent] = []
    try:
        async for event in stream:
            events.append(event)
            if event.HasField("turn_end"):
                return events
    finally:
        stream.close()
    raise AssertionError(f"the stream ended after {len(events)} events, before the turn did")


async def test_health_answers_while_an_echo_agent_streams_a_megabyte(tmp_path: Path) -> None:
    text = "word " * 200_000  # 1 MB, under limits.maxContentBytes: 125,000 chunk events
    async with server_in_a_process(tmp_path) as client:
        await client.factory.CreateAgent(fac.CreateAgentRequest(agent_id="e"), timeout=T)
        await client.agents.SendMessage(api.SendMessageRequest(agent_id="e", text=text))
        events, probes = await health_between_counts(client, "e", whole_turn(client, "e"))
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    assert text_of(of_kind(events, "assistant_message")[0].assistant_message.content) == (
        f"You said: {text}"
    )
    chunks = [e.seq for e in events if e.HasField("assistant_chunk")]
    # A health check was answered mid-stream: sent once the stream's first chunk was
    # stored, answered before its last one was. A server that streamed the megabyte
    # without letting other work in would answer none in between.
    during = [
        (before, after) for before, after in probes if chunks[0] <= before <= after < chunks[-1]
    ]
    assert during, (chunks[0], chunks[-1], probes)


async def test_a_hostile_persona_with_a_late_close_is_refused_naming_it(small: E2E) -> None:
    request = fac.CreateAgentRequest(agent_id="h", options=scripted(persona="{{" * 400_000 + "}}"))
    details = await refused(small.factory.CreateAgent(request, timeout=T), INVALID)
    assert details.startswith("options.persona: malformed prompt variable reference")
    assert len(details) < 200  # the huge group is not echoed back


async def test_a_cwd_persona_is_refused_for_an_agent_without_a_cwd(small: E2E) -> None:
    request = fac.CreateAgentRequest(agent_id="p", options=scripted(persona="Work in {{cwd}}."))
    details = await refused(small.factory.CreateAgent(request, timeout=T), INVALID)
    assert details == 'options.persona: prompt variable "cwd" has no value for this assembly'
    request.metadata.cwd = "/srv"
    created = await small.factory.CreateAgent(request, timeout=T)
    assert created.agent.agent_id == "p"


INVALID = grpc.StatusCode.INVALID_ARGUMENT


async def test_content_over_the_limit_is_refused_and_nothing_is_appended(small: E2E) -> None:
    await small.factory.CreateAgent(fac.CreateAgentRequest(agent_id="c", options=scripted()))
    calls = [
        small.agents.SendMessage(api.SendMessageRequest(agent_id="c", text="x" * 1001), timeout=T),
        small.agents.SteerMessage(
            api.SteerMessageRequest(agent_id="c", text="x" * 1001), timeout=T
        ),
        small.agents.InjectContext(
            api.InjectContextRequest(agent_id="c", text="x" * 1001), timeout=T
        ),
    ]
    for call in calls:
        details = await refused(call, INVALID)
        assert details == "text: has 1001 bytes, over the limit limits.maxContentBytes (1000)"
    session = await small.agents.GetSession(api.GetSessionRequest(agent_id="c"), timeout=T)
    assert session.session.event_count == 0


async def test_a_request_over_the_size_limit_is_resource_exhausted(small: E2E) -> None:
    await small.factory.CreateAgent(fac.CreateAgentRequest(agent_id="r", options=scripted()))
    request = api.SendMessageRequest(agent_id="r", text="x" * (4 * 1024 * 1024 + 1))
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    details = await refused(small.agents.SendMessage(request, timeout=T), exhausted)
    assert str(Limits().max_request_bytes) in details
    assert await small.health() == 1  # SERVING


async def test_persona_and_script_sizes_are_refused_naming_the_limit(small: E2E) -> None:
    cases = [
        (scripted(persona="p" * (2 * 1024 * 1024 + 1)), "limits.maxPersonaBytes (2097152)"),
        (scripted(*[scripted_pb2.ScriptedStep(text="s")] * 4), "limits.maxScriptSteps (3)"),
        (
            scripted(
                scripted_pb2.ScriptedStep(tool_calls=[scripted_pb2.ScriptedToolCall(name="t")] * 3),
                scripted_pb2.ScriptedStep(tool_calls=[scripted_pb2.ScriptedToolCall(name="t")] * 2),
            ),
            "limits.maxScriptToolCalls (4)",
        ),
        (scripted(scripted_pb2.ScriptedStep(text="s" * 1001)), "limits.maxContentBytes (1000)"),
    ]
    for options, limit in cases:
        request = fac.CreateAgentRequest(agent_id="s", options=options)
        details = await refused(small.factory.CreateAgent(request, timeout=T), INVALID)
        assert details.startswith("options.") and details.endswith(limit), details
    listed = await small.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
    assert list(listed.agents) == []


async def test_agents_past_the_limit_are_resource_exhausted(small: E2E) -> None:
    for i in range(3):
        await small.factory.CreateAgent(fac.CreateAgentRequest(agent_id=f"a{i}"), timeout=T)
    request = fac.CreateAgentRequest(agent_id="a3")
    details = await refused(
        small.factory.CreateAgent(request, timeout=T), grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert details == "agents: the server reached limits.maxAgents (3)"
    await small.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="a0"), timeout=T)
    await small.factory.CreateAgent(request, timeout=T)  # a slot was freed


async def test_too_many_tool_calls_in_a_step_end_the_turn_naming_the_limit(small: E2E) -> None:
    calls = [scripted_pb2.ScriptedToolCall(name="t", arguments="{}")] * 3
    options = scripted(scripted_pb2.ScriptedStep(tool_calls=calls))
    await small.factory.CreateAgent(fac.CreateAgentRequest(agent_id="t", options=options))
    await small.agents.SendMessage(api.SendMessageRequest(agent_id="t", text="go"), timeout=T)
    events = await read_turn(small.agents, "t", 0)
    error = events[-1].turn_end.reason.error
    assert error.code == "TOOL_CALLS_PER_STEP"
    assert error.message.endswith("limits.maxToolCallsPerStep (2)")
    assert not [e for e in events if e.HasField("tool_call")]  # no call left unanswered


async def test_too_many_events_in_a_turn_end_it_naming_the_limit(small: E2E) -> None:
    options = scripted(scripted_pb2.ScriptedStep(text="y" * 900, chunk_size=1))
    await small.factory.CreateAgent(fac.CreateAgentRequest(agent_id="e", options=options))
    await small.agents.SendMessage(api.SendMessageRequest(agent_id="e", text="go"), timeout=T)
    events = await read_turn(small.agents, "e", 0)
    error = events[-1].turn_end.reason.error
    assert error.code == "EVENTS_PER_TURN"
    assert error.message.endswith("limits.maxEventsPerTurn (300)")
    assert len(events) < 310
    # The agent is still usable afterwards.
    assert await small.health() == 1


async def test_event_streams_past_the_limit_are_resource_exhausted(small: E2E) -> None:
    await small.factory.CreateAgent(fac.CreateAgentRequest(agent_id="s"), timeout=T)
    with EventStream(small.agents, agent_id="s") as one, EventStream(small.agents, agent_id="s"):
        await small.agents.SendMessage(api.SendMessageRequest(agent_id="s", text="go"), timeout=T)
        await one.until("turn_end")  # both streams are open now
        third = EventStream(small.agents, agent_id="s")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await third.next()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.maxStreams (2)" in (info.value.details() or "")
    for _ in range(50):  # the two closed streams free their slots (asynchronously)
        if small.app.server is not None and await _stream_opens(small):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("a stream slot was never freed")


async def test_messages_past_the_pending_limit_are_refused_until_a_turn_takes_them(
    small: E2E,
) -> None:
    slow = scripted_pb2.ScriptedStep(
        text="x" * 20, chunk_size=1, chunk_delay=duration_pb2.Duration(nanos=100_000_000)
    )
    options = scripted(slow, slow, slow)
    await small.factory.CreateAgent(fac.CreateAgentRequest(agent_id="q", options=options))
    with EventStream(small.agents, agent_id="q") as stream:
        await small.agents.SendMessage(api.SendMessageRequest(agent_id="q", text="0"), timeout=T)
        first = await stream.until("user_message")  # the first turn took its message up
        for i in (1, 2):
            await small.agents.SendMessage(
                api.SendMessageRequest(agent_id="q", text=str(i), request_id=f"m{i}"), timeout=T
            )
        for call in (
            small.agents.SendMessage(api.SendMessageRequest(agent_id="q", text="3"), timeout=T),
            small.agents.SteerMessage(api.SteerMessageRequest(agent_id="q", text="3"), timeout=T),
        ):
            details = await refused(call, grpc.StatusCode.RESOURCE_EXHAUSTED)
            assert details == (
                'agent "q" has 2 messages waiting for a turn: limits.maxPendingMessages (2);'
                " retry when it has taken some up"
            )
        retry = api.SendMessageRequest(agent_id="q", text="1", request_id="m1")
        await small.agents.SendMessage(retry, timeout=T)  # an accepted one still answers
        texts = [first.user_message.content[0].text.text]
        while len(texts) < 3:
            event = await stream.until("user_message")
            texts.append(event.user_message.content[0].text.text)
    assert texts == ["0", "1", "2"]  # nothing refused was queued, nothing accepted lost
    await small.agents.SendMessage(api.SendMessageRequest(agent_id="q", text="4"), timeout=T)


async def _stream_opens(e2e: E2E) -> bool:
    with EventStream(e2e.agents, agent_id="s", replay_only=True) as stream:
        try:
            await stream.drain()
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return False
    return True


async def test_a_model_message_over_the_content_limit_ends_the_turn(small: E2E) -> None:
    echo = agent_pb2.AgentOptions(provider="scripted", model="echo")
    await small.factory.CreateAgent(fac.CreateAgentRequest(agent_id="m", options=echo))
    request = api.SendMessageRequest(agent_id="m", text="z" * 1000)  # the echo adds a prefix
    await small.agents.SendMessage(request, timeout=T)
    events = await read_turn(small.agents, "m", 0)
    error = events[-1].turn_end.reason.error
    assert error.code == "CONTENT_BYTES"
    assert error.message.startswith("the model's message passed 10")  # a chunk at a time
    assert error.message.endswith(" bytes; limits.maxContentBytes (1000)")


async def test_a_tool_result_over_the_content_limit_is_replaced_by_an_error(small: E2E) -> None:
    async def big(exec: ToolExecution) -> ToolValue:
        return "t" * 5000  # a tool (a plugin's, say) may return anything

    small.app.runtime.tools.register(make_tool("big", big))
    call = scripted_pb2.ScriptedToolCall(name="big", arguments="{}")
    options = scripted(
        scripted_pb2.ScriptedStep(tool_calls=[call]), scripted_pb2.ScriptedStep(text="ok")
    )
    options.tools.append("big")
    await small.factory.CreateAgent(fac.CreateAgentRequest(agent_id="r", options=options))
    await small.agents.SendMessage(api.SendMessageRequest(agent_id="r", text="go"), timeout=T)
    events = await read_turn(small.agents, "r", 0)
    (result,) = of_kind(events, "tool_result")
    assert result.tool_result.is_error
    assert result.tool_result.error.code == "CONTENT_BYTES"
    assert text_of(result.tool_result.content).startswith("Error: the tool result has ")
    assert text_of(result.tool_result.content).endswith("limits.maxContentBytes (1000)")
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"  # the model went on


async def test_a_resumed_agent_s_persona_is_checked_against_the_stored_cwd(
    tmp_path: Path,
) -> None:
    config = Config(listen="127.0.0.1:0", data_dir=str(tmp_path), agents=())
    async with running_app(config) as e2e:
        created = await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="a"), timeout=T)
        session_id = created.agent.session_id
        await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="a"), timeout=T)
        resume = fac.ResumeAgentRequest(
            agent_id="b", session_id=session_id, options=scripted(persona="In {{cwd}}.")
        )
        details = await refused(e2e.factory.ResumeAgent(resume, timeout=T), INVALID)
        assert details == 'options.persona: prompt variable "cwd" has no value for this assembly'
        resume.options.persona = "As {{model}}."
        resumed = await e2e.factory.ResumeAgent(resume, timeout=T)  # the session was let go
        assert resumed.agent.session_id == session_id
