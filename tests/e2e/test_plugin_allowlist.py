"""Outbound connections are the operator's choice: plugin addresses must match the
allowlist, and the plugin token goes nowhere else (nor in clear beyond loopback)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agentloop.plugin.sdk import Plugin
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import decision_pb2
from server.kernel.limits import Limits
from server.settings.addresses import is_loopback
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, running_app

T = READ_TIMEOUT
PLUGIN_TOKEN = "plugin-token-Y"


class Recorder(grpc.GenericRpcHandler):
    """Records every call a fake plugin receives, with its metadata; serves none."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> None:
        metadata = dict(handler_call_details.invocation_metadata or ())
        self.calls.append((handler_call_details.method or "", metadata))


@contextlib.asynccontextmanager
async def fake_plugin() -> AsyncIterator[tuple[int, Recorder]]:
    """A real gRPC server on 127.0.0.1 that records what reaches it."""
    recorder = Recorder()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((recorder,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port, recorder
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def server_with(monkeypatch: pytest.MonkeyPatch, **config: Any) -> AsyncIterator[E2E]:
    """A server holding PLUGIN_TOKEN, with `config` fields set."""
    monkeypatch.setenv("AGENTLOOP_PLUGIN_TOKEN", PLUGIN_TOKEN)
    monkeypatch.delenv("AGENTLOOP_TOKEN", raising=False)
    async with running_app(Config(listen="127.0.0.1:0", store="memory", **config)) as running:
        yield running


async def register_refused(e2e: E2E, address: str) -> str:
    """RegisterPlugin must fail INVALID_ARGUMENT; returns the details."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await e2e.registry.RegisterPlugin(reg.RegisterPluginRequest(address=address), timeout=T)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value.details() or ""


async def test_a_plugin_outside_the_allowlist_receives_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with fake_plugin() as (port, recorder):
        async with server_with(monkeypatch, plugin_allowlist=("localhost:1",)) as e2e:
            details = await register_refused(e2e, f"127.0.0.1:{port}")
            assert details == (
                f"address: '127.0.0.1:{port}' is not allowed by pluginAllowlist (localhost:1)"
            )
        assert recorder.calls == []  # no Describe, no token
        # The same fake plugin on an allowed address is reached, token and all.
        async with server_with(monkeypatch, plugin_allowlist=(f"127.0.0.1:{port}",)) as e2e:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await e2e.registry.RegisterPlugin(
                    reg.RegisterPluginRequest(address=f"127.0.0.1:{port}"), timeout=T
                )
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # it serves nothing
        method, metadata = recorder.calls[0]
        assert method == "/agentloop.plugin.v1.HookService/Describe"
        assert metadata["authorization"] == f"Bearer {PLUGIN_TOKEN}"


async def test_plugin_addresses_are_validated_before_any_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with server_with(monkeypatch) as e2e:
        assert "the port must be 1-65535" in await register_refused(e2e, "127.0.0.1:99999")
        assert "the port must be 1-65535" in await register_refused(e2e, "127.0.0.1:0")
        assert "the port must be 1-65535" in await register_refused(e2e, "127.0.0.1:²")
        # A name that starts like a loopback address is a name, not loopback.
        details = await register_refused(e2e, "127.x.example:80")
        assert "is not allowed by pluginAllowlist" in details
        assert "needs brackets" in await register_refused(e2e, "::1:80")


async def test_the_plugin_token_goes_beyond_loopback_only_over_tls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with server_with(monkeypatch, plugin_allowlist=("*:*",)) as e2e:
        details = await register_refused(e2e, "192.0.2.1:5000")  # TEST-NET: never reached
        assert details.endswith(
            "the plugin token goes only over tls:// there (or set pluginTokenPlaintext)"
        )


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:1", True), ("127.9.9.9:1", True), ("[::1]:1", True), ("localhost:1", True),
        ("127.x.example:1", False), ("0.0.0.0:1", False), ("[::]:1", False),
        ("10.0.0.1:1", False), ("example.com:1", False),
    ],
)  # fmt: skip
def test_loopback_is_an_address_check(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback


async def test_plugins_past_the_limit_are_resource_exhausted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin = Plugin("first")

    @plugin.prompt_submit()
    async def allow(call: hs.HookCall) -> decision_pb2.PromptDecision:
        return decision_pb2.PromptDecision()

    port = await plugin.serve("127.0.0.1:0")
    try:
        async with fake_plugin() as (second, recorder):
            async with server_with(monkeypatch, limits=Limits(max_plugins=1)) as e2e:
                await e2e.registry.RegisterPlugin(
                    reg.RegisterPluginRequest(address=f"127.0.0.1:{port}"), timeout=T
                )
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await e2e.registry.RegisterPlugin(
                        reg.RegisterPluginRequest(address=f"127.0.0.1:{second}"), timeout=T
                    )
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert info.value.details() == "plugins: the server reached limits.maxPlugins (1)"
            assert recorder.calls == []
    finally:
        await plugin.stop(0)
