"""A plugin's protocol faults stay with it: garbage, strays, unknown kinds, oversized calls.

The misbehaving plugin is `tests/plugins/rogue.py`, written on raw grpcio so that it can
put any bytes on the wire; the size test uses `tests/plugins/configurable.py`.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import hook_service_pb2_grpc as hk_rpc
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_service_pb2 as api
from server.settings.config import Config
from tests.e2e.conftest import E2E, kinds, read_turn, running_app
from tests.e2e.registry import (
    eventually,
    list_plugins,
    plugin_state,
    register,
    unregister,
    wait_state,
)
from tests.e2e.test_plugins import (
    Describer,
    T,
    create_agent,
    end_reason,
    plugin_error,
    refused,
    run_turn,
    user_text,
    wait_call_sent,
)
from tests.processes import PluginLauncher, configurable, rogue

pytestmark = pytest.mark.usefixtures("without_tokens")


async def test_garbage_bytes_reset_the_stream_and_the_plugin_recovers(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(rogue("--name", "garbler", "--garbage", "1"))
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "a")

    events = await run_turn(e2e, "a", "p")

    message = plugin_error(events, "PLUGIN_MALFORMED", "garbler")
    assert "agent/prompt-submit" in message and "does not decode" in message
    assert kinds(events).count("turn_end") == 1

    # The server reset the stream and reconnected: the next call is served.
    async def reconnected() -> bool:
        listed = await plugin_state(e2e.channel, "garbler")
        return listed.state == reg.PLUGIN_STATE_READY and listed.stats.reconnects >= 1

    await eventually(reconnected, "the garbling plugin to be reconnected")
    assert (await plugin_state(e2e.channel, "garbler")).stats.protocol_errors == 1
    events = await run_turn(e2e, "a", "q")
    assert end_reason(events).WhichOneof("kind") == "completed"
    assert user_text(events) == "q-R"
    await unregister(e2e.channel, "garbler")  # clean, never UNKNOWN


async def test_stray_and_duplicate_results_are_counted_and_ignored(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(rogue("--name", "chatty", "--extras"))
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "a")

    events = await run_turn(e2e, "a", "p")
    assert user_text(events) == "p-R"

    async def counted() -> bool:
        return (await plugin_state(e2e.channel, "chatty")).stats.unexpected_results == 2

    await eventually(counted, "the stray and the duplicate result to be counted")
    listed = await plugin_state(e2e.channel, "chatty")
    assert listed.state == reg.PLUGIN_STATE_READY and listed.stats.reconnects == 0


async def test_a_decision_of_an_unknown_kind_fails_closed(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(rogue("--name", "newer", "--unknown-kind"))
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "a")

    events = await run_turn(e2e, "a", "p")

    assert "[99]" in plugin_error(events, "PLUGIN_MALFORMED", "newer")
    assert "user_message" not in kinds(events)


async def test_an_oversized_call_fails_alone(launcher: PluginLauncher) -> None:
    config = Config(listen="127.0.0.1:0", store="memory", plugin_max_message_bytes=32 * 1024)
    async with running_app(config) as e2e:
        plugin = await launcher.start(
            configurable("python", "--name", "sizer", "--tag", "S", "--slow", "0.5")
        )
        await register(e2e.channel, plugin.address)
        await create_agent(e2e, "small")
        await create_agent(e2e, "big")
        sent = await e2e.agents.SendMessage(
            api.SendMessageRequest(agent_id="small", text="p"), timeout=T
        )
        await wait_call_sent(e2e.channel, "sizer")

        # Over the limit while the small call is in flight on the same stream.
        events = await run_turn(e2e, "big", "x" * 40_000)

        message = plugin_error(events, "PLUGIN_OVERSIZED", "sizer")
        assert "32768-byte message limit" in message
        small = await read_turn(e2e.agents, "small", sent.next_seq)
        assert end_reason(small).WhichOneof("kind") == "completed"
        assert user_text(small) == "p-S"
        listed = await wait_state(e2e.channel, "sizer")
        assert (listed.stats.oversized_calls, listed.stats.reconnects) == (1, 0)


async def test_a_plugin_restarted_with_new_subscriptions_is_described_again(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(configurable("python", "--name", "morph", "--tag", "A"))
    registered = await register(e2e.channel, plugin.address)
    assert [s.seam for s in registered.subscriptions] == [hk.SEAM_PROMPT_SUBMIT]
    await create_agent(e2e, "a")
    assert user_text(await run_turn(e2e, "a", "p")) == "p-A"

    await plugin.kill()
    await launcher.start(
        configurable("python", "--name", "morph", "--block", "closed now",
                     "--deny-tool", "echo", "--tool", "morph_tool"),
        listen=plugin.address,
    )  # fmt: skip

    async def redescribed() -> bool:
        listed = await plugin_state(e2e.channel, "morph")
        return listed.state == reg.PLUGIN_STATE_READY and len(listed.subscriptions) == 2

    await eventually(redescribed, "the restarted plugin to be described again")
    listed = await plugin_state(e2e.channel, "morph")
    assert [s.seam for s in listed.subscriptions] == [
        hk.SEAM_PROMPT_SUBMIT,
        hk.SEAM_TOOLS_PRE_EXECUTE,
    ]
    assert [t.name for t in listed.tools] == ["morph_tool"]
    assert listed.stats.reconnects >= 1
    events = await run_turn(e2e, "a", "p")
    assert end_reason(events).WhichOneof("kind") == "rejected"


class RecordingDescriber(Describer):
    """Answers Describe with the description given, and keeps the requests."""

    def __init__(self, description: hk.DescribeResponse) -> None:
        super().__init__(description)
        self.requests: list[hk.DescribeRequest] = []

    async def Describe(
        self, request: hk.DescribeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> hk.DescribeResponse:
        self.requests.append(request)
        return self.description


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("protocol_version", 2, "protocol version 2"),
        ("capabilities", ["time_travel"], "'time_travel'"),
    ],
)
async def test_a_newer_protocol_or_an_unoffered_capability_is_refused(
    e2e: E2E, field: str, value: object, reason: str
) -> None:
    description = hk.DescribeResponse(
        name="future", subscriptions=[hk.Subscription(seam=hk.SEAM_PROMPT_SUBMIT)]
    )
    if isinstance(value, list):
        getattr(description, field).extend(value)
    else:
        setattr(description, field, value)
    describer = RecordingDescriber(description)
    server = grpc.aio.server()
    hk_rpc.add_HookServiceServicer_to_server(describer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        error = await refused(e2e, f"127.0.0.1:{port}")
    finally:
        await server.stop(0)

    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason in (error.details() or "")
    (request,) = describer.requests
    assert request.protocol_version == 1
    assert request.max_message_bytes == 16 * 1024 * 1024
    assert "model_stream" in request.capabilities
    assert await list_plugins(e2e.channel) == {}
