"""A plugin on this machine over a Unix domain socket: only where the operator's
allowlist names the socket or its directory."""

from __future__ import annotations

import contextlib
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, kinds, read_turn, running_app, text_of
from tests.e2e.registry import register
from tests.processes import PluginLauncher, configurable

T = READ_TIMEOUT


@contextlib.asynccontextmanager
async def server_with(**config: Any) -> AsyncIterator[E2E]:
    async with running_app(Config(listen="127.0.0.1:0", store="memory", **config)) as running:
        yield running


async def refused(e2e: E2E, address: str) -> str:
    """RegisterPlugin must fail INVALID_ARGUMENT; returns the details."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await e2e.registry.RegisterPlugin(reg.RegisterPluginRequest(address=address), timeout=T)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value.details() or ""


async def test_a_python_plugin_decides_over_a_unix_socket_its_allowlist_names(
    tmp_path: Path, launcher: PluginLauncher
) -> None:
    path = tmp_path / "tagger.sock"
    plugin = await launcher.start(
        configurable("python", "--name", "unix-tagger", "--tag", "U"), listen=f"unix:{path}"
    )
    assert plugin.address == f"unix:{path}"
    assert stat.S_ISSOCK(path.stat().st_mode)  # a real socket file
    async with server_with(plugin_allowlist=(f"unix:{path.parent}/*",)) as e2e:
        registered = await register(e2e.channel, plugin.address)
        assert registered.state == reg.PLUGIN_STATE_READY
        await e2e.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="u", options=agent_pb2.AgentOptions()), timeout=T
        )
        sent = await e2e.agents.SendMessage(
            api.SendMessageRequest(agent_id="u", text="hi"), timeout=T
        )
        events = await read_turn(e2e.agents, "u", sent.next_seq)
        user = events[kinds(events).index("user_message")].user_message
        assert text_of(user.content) == "hi-U"  # the plugin's rewrite, over the socket
        assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"


async def test_a_socket_the_allowlist_does_not_name_is_refused(
    tmp_path: Path, launcher: PluginLauncher
) -> None:
    path = tmp_path / "guard.sock"
    plugin = await launcher.start(
        configurable("python", "--name", "unix-guard", "--block", "no"), listen=f"unix:{path}"
    )
    address = plugin.address
    # Loopback by default, every host by `*:*`: neither names a socket.
    for allowlist in ((), ("*:*",), (f"unix:{path.parent}/other.sock",)):
        config = {"plugin_allowlist": allowlist} if allowlist else {}
        async with server_with(**config) as e2e:
            details = await refused(e2e, address)
            assert details.startswith(f"address: {address!r} is not allowed by pluginAllowlist")
            assert details.endswith("(a Unix socket must be named: unix:/path or unix:/dir/*)")
            assert e2e.app.plugins.plugins == {}
    # The socket itself, named exactly, is allowed.
    async with server_with(plugin_allowlist=(f"unix:{path}",)) as e2e:
        assert (await register(e2e.channel, address)).name == "unix-guard"


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("unix:relative.sock", "must be absolute: unix:/path/to/socket"),
        ("unix:/tmp/../etc/x.sock", "must be normalized (no '.', '..', '//' or trailing '/')"),
        ("unix:/tmp/dir/", "must be normalized (no '.', '..', '//' or trailing '/')"),
        ("unix:/tmp/a b.sock", "must not hold spaces or control characters"),
        (f"unix:/{'x' * 107}", "must be at most 107 bytes long"),
    ],
)
async def test_a_malformed_socket_address_is_refused_naming_the_field(
    address: str, problem: str
) -> None:
    async with server_with(plugin_allowlist=("unix:/*", "unix:/tmp/*")) as e2e:
        details = await refused(e2e, address)
        shown = address if len(address) <= 80 else f"{address[:80]}..."
        assert details == f"address: {shown!r}: a Unix socket path {problem}"
