"""A turn served end to end by a model provider running in a plugin process.

The example `clients/python/examples/model_plugin.py` runs as a subprocess; a real
`App` registers it through `PluginRegistryService`, and agents selecting its provider
("plugin-echo") talk to it through `AgentService`.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentloop.plugin import sdk
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, stream_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.content import plain_text
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, EventStream, kinds, read_turn, running_app
from tests.e2e.registry import register, wait_state
from tests.plugin_client import serving
from tests.processes import PluginLauncher

EXAMPLE = Path(__file__).parents[2] / "clients" / "python" / "examples" / "model_plugin.py"
T = READ_TIMEOUT
"""The longest any single wait may take."""


@dataclass
class Server:
    """A running server, a client, and the plugin processes started for the test."""

    e2e: E2E
    launcher: PluginLauncher

    async def start_plugin(self, *args: str, listen: str = "127.0.0.1:0") -> str:
        """Start the example plugin; returns the address it printed once listening."""
        plugin = await self.launcher.start([sys.executable, str(EXAMPLE), *args], listen=listen)
        assert plugin.name == "model-echo"
        return plugin.address

    async def register(self, address: str, name: str = "model-echo") -> reg.Plugin:
        """Register the plugin at `address`; returns it once READY."""
        registered = await register(self.e2e.channel, address)
        assert registered.name == name
        return registered

    async def plugin_state(
        self, name: str, states: Collection[reg.PluginState.ValueType]
    ) -> reg.Plugin:
        """Poll `ListPlugins` until the plugin `name` is in one of `states`."""
        return await wait_state(self.e2e.channel, name, states)

    async def create(self, agent_id: str, provider: str, tools: Sequence[str] = ()) -> None:
        options = agent_pb2.AgentOptions(provider=provider, tools=list(tools))
        await self.e2e.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id=agent_id, options=options), timeout=T
        )

    async def send(self, agent_id: str, text: str) -> int:
        """Send `text`; returns the seq the turn's events start at."""
        sent = await self.e2e.agents.SendMessage(
            api.SendMessageRequest(agent_id=agent_id, text=text), timeout=T
        )
        return sent.next_seq

    async def turn(self, agent_id: str, text: str) -> list[ev.SessionEvent]:
        """Send `text` and read the turn's session events up to its end."""
        return await read_turn(self.e2e.agents, agent_id, await self.send(agent_id, text))


@pytest.fixture
async def server(launcher: PluginLauncher) -> AsyncIterator[Server]:
    async with running_app(Config(listen="127.0.0.1:0", store="memory")) as e2e:
        yield Server(e2e, launcher)


def assistant_messages(events: list[ev.SessionEvent]) -> list[ev.AssistantMessage]:
    return [e.assistant_message for e in events if e.HasField("assistant_message")]


async def test_a_plugin_model_serves_a_turn(server: Server) -> None:
    registered = await server.register(await server.start_plugin())
    assert [(m.provider, m.default_model) for m in registered.models] == [
        ("plugin-echo", "reverse")
    ]
    await server.create("echo", "plugin-echo")
    events = await server.turn("echo", "hello world")
    [message] = assistant_messages(events)
    assert plain_text(message.content) == "dlrow olleh"
    assert (message.provenance.provider, message.provenance.model) == ("plugin-echo", "reverse")
    assert message.usage.output_tokens == len("dlrow olleh") // 4
    deltas = [
        e.assistant_chunk.chunk.block_delta.text
        for e in events
        if e.HasField("assistant_chunk") and e.assistant_chunk.chunk.HasField("block_delta")
    ]
    assert deltas == ["dlr", "ow ", "oll", "eh"]  # streamed, as the plugin produced them
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    listed = await server.plugin_state("model-echo", {reg.PLUGIN_STATE_READY})
    [model_calls] = [lat for lat in listed.latencies if lat.kind == hk.CALL_KIND_MODEL_STREAM]
    assert model_calls.calls == 1


async def test_a_plugin_model_calls_a_tool_and_answers_with_its_result(server: Server) -> None:
    await server.register(await server.start_plugin())
    await server.create("clock", "plugin-echo", tools=["current_time"])
    events = await server.turn("clock", "what time is it")
    assert kinds(events).count("step_start") == 2
    [call] = [e.tool_call for e in events if e.HasField("tool_call")]
    assert (call.name, call.call_id) == ("current_time", "time_1_1")
    [result] = [e.tool_result for e in events if e.HasField("tool_result")]
    time = plain_text(result.content)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", time), time
    first, second = assistant_messages(events)
    assert [b.tool_call.name for b in first.content] == ["current_time"]
    assert plain_text(second.content) == f"It is {time}"
    assert second.provenance.provider == "plugin-echo"
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"


async def test_a_plugin_killed_mid_stream_fails_the_turn_and_the_server_keeps_serving(
    server: Server,
) -> None:
    address = await server.start_plugin("--chunk-delay", "0.5")
    await server.register(address)
    await server.create("echo", "plugin-echo")
    await server.create("local", "scripted")
    (plugin,) = server.launcher.started
    from_seq = await server.send("echo", "hello world")
    with EventStream(server.e2e.agents, agent_id="echo", from_seq=from_seq) as stream:
        first = await stream.until("assistant_chunk")
        assert first.assistant_chunk.chunk.HasField("block_start")
        await plugin.kill()  # mid-stream: the deltas come 0.5 s apart
        end = await stream.until("turn_end")
    error = end.turn_end.reason.error
    assert end.turn_end.reason.WhichOneof("kind") == "error"
    assert 'plugin "model-echo"' in error.message, error.message
    assert error.code == "PLUGIN_DISCONNECTED"
    assert not assistant_messages(stream.events)  # the partial answer is not kept
    # The server keeps serving: other agents, and the listing of the plugin that is down.
    local = await server.turn("local", "still there?")
    assert local[-1].turn_end.reason.WhichOneof("kind") == "completed"
    down = await server.plugin_state(
        "model-echo", {reg.PLUGIN_STATE_UNAVAILABLE, reg.PLUGIN_STATE_CONNECTING}
    )
    assert down.last_error
    # The plugin comes back on its address: the server reconnects and the agent works again.
    await server.start_plugin("--chunk-delay", "0.01", listen=address)
    await server.plugin_state("model-echo", {reg.PLUGIN_STATE_READY})
    events = await server.turn("echo", "again")
    assert plain_text(assistant_messages(events)[-1].content) == "niaga"
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"


@dataclass
class InProcess:
    """An in-process plugin whose models show how the server withdraws and fails calls."""

    plugin: sdk.Plugin
    address: str = ""
    closed: dict[str, asyncio.Event] = field(default_factory=dict)

    def hang(self, provider: str, timeout: float | None = None) -> None:
        """Serve `provider`: one chunk, then silence until the call is withdrawn."""
        closed = self.closed[provider] = asyncio.Event()

        @self.plugin.model(provider, default_model="m", timeout=timeout)
        async def hang(call: hk.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
            try:
                yield sdk.text_chunks("partial")[0]
                await asyncio.sleep(3600)
            finally:
                closed.set()


@pytest.fixture
async def in_process() -> AsyncIterator[InProcess]:
    probe = InProcess(sdk.Plugin("in-process"))
    probe.hang("hanging")
    probe.hang("silent", timeout=0.3)

    @probe.plugin.model("failing", default_model="m")
    async def failing(call: hk.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
        yield sdk.text_chunks("partial")[0]
        raise RuntimeError("quota exceeded")

    @probe.plugin.model("overloaded", default_model="m")
    async def overloaded(call: hk.HookCall) -> list[stream_pb2.StreamChunk]:
        return [sdk.finish_chunk(sdk.ERROR, "try again later", "OVERLOADED")]

    async with serving(probe.plugin) as address:
        probe.address = address
        yield probe


async def test_cancel_turn_withdraws_the_plugin_model_call(
    server: Server, in_process: InProcess
) -> None:
    await server.register(in_process.address, "in-process")
    await server.create("a", "hanging")
    from_seq = await server.send("a", "hi")
    with EventStream(server.e2e.agents, agent_id="a", from_seq=from_seq) as stream:
        await stream.until("assistant_chunk")
        await server.e2e.agents.CancelTurn(api.CancelTurnRequest(agent_id="a", reason="enough"))
        end = await stream.until("turn_end")
    assert end.turn_end.reason.aborted.reason == "enough"
    async with asyncio.timeout(T):
        await in_process.closed["hanging"].wait()  # the CancelCall reached the plugin


@pytest.mark.parametrize(
    ("provider", "code", "message"),
    [
        ("silent", "PLUGIN_TIMEOUT", "no chunk within 0.3 s"),
        ("failing", "PLUGIN_ERROR", "quota exceeded"),
        ("overloaded", "OVERLOADED", "try again later"),
    ],
)
async def test_plugin_model_failures_end_the_turn_with_an_error(
    server: Server, in_process: InProcess, provider: str, code: str, message: str
) -> None:
    await server.register(in_process.address, "in-process")
    await server.create("a", provider)
    events = await server.turn("a", "hi")
    error = events[-1].turn_end.reason.error
    assert (error.code, message in error.message) == (code, True), error
    if provider != "overloaded":  # a finish is the model's own answer, not the plugin's
        assert 'plugin "in-process" model ' + provider in error.message
    assert not assistant_messages(events)
    await server.create("b", "overloaded")  # the plugin keeps serving
    assert (await server.turn("b", "hi"))[-1].turn_end.reason.error.code == "OVERLOADED"
