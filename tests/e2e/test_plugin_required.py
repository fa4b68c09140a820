"""A required config plugin guards every turn from the start, even before it connects."""

from __future__ import annotations

import pytest
from grpc_health.v1 import health_pb2

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from server.plugins.required import READINESS_SERVICE
from server.settings.config import Config, PluginConfig
from tests.e2e.conftest import E2E, kinds, running_app
from tests.e2e.registry import eventually, plugin_state, wait_state
from tests.e2e.test_plugins import create_agent, end_reason, plugin_error, run_turn, user_text
from tests.processes import PluginLauncher, configurable, free_port

pytestmark = pytest.mark.usefixtures("without_tokens")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_a_required_plugin_started_late_fails_turns_closed_until_ready(
    launcher: PluginLauncher,
) -> None:
    port = free_port()
    config = Config(
        listen="127.0.0.1:0",
        store="memory",
        plugins=(PluginConfig(address=f"127.0.0.1:{port}", name="gate"),),
    )
    async with running_app(config) as e2e:
        # Listed before it ever answered, and the server is not ready.
        listed = await plugin_state(e2e.channel, "gate")
        assert (listed.state, listed.required) == (reg.PLUGIN_STATE_CONNECTING, True)
        assert await e2e.health(READINESS_SERVICE) == NOT_SERVING
        assert await e2e.health() == SERVING  # the server itself serves
        await create_agent(e2e, "guarded")

        events = await run_turn(e2e, "guarded", "p")

        assert "agent/prompt-submit" in plugin_error(events, "PLUGIN_NOT_READY", "gate")
        assert "user_message" not in kinds(events)

        await launcher.start(
            configurable("python", "--name", "gate", "--tag", "G"), listen=f"127.0.0.1:{port}"
        )
        ready = await wait_state(e2e.channel, "gate")
        assert ready.required

        async def readiness_serving() -> bool:
            return await e2e.health(READINESS_SERVICE) == SERVING

        await eventually(readiness_serving, "readiness to be SERVING")
        events = await run_turn(e2e, "guarded", "p")
        assert end_reason(events).WhichOneof("kind") == "completed"
        assert user_text(events) == "p-G"


async def test_without_required_plugins_the_server_is_ready(e2e: E2E) -> None:
    assert await e2e.health(READINESS_SERVICE) == SERVING
