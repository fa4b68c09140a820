"""Plugins through `PluginRegistryService` (the SDK's facade verbs): register, list, and
wait for a state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection

import grpc

from agentloop.client import Client
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from tests.e2e.conftest import READ_TIMEOUT

T = READ_TIMEOUT
"""The deadline of every call and of every wait."""


def _client(channel: grpc.aio.Channel) -> Client:
    """The SDK's client on `channel` (closing it is the caller's), every call bounded."""
    return Client(channel, timeout=T)


async def list_plugins(channel: grpc.aio.Channel) -> dict[str, reg.Plugin]:
    """ListPlugins, by name."""
    return {plugin.name: plugin for plugin in await _client(channel).plugins()}


async def eventually(check: Callable[[], Awaitable[bool]], what: str, seconds: float = T) -> None:
    """Poll `check` every 20 ms until it holds; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def plugin_state(channel: grpc.aio.Channel, name: str) -> reg.Plugin:
    """One plugin as ListPlugins shows it."""
    plugins = await list_plugins(channel)
    assert name in plugins, f"plugin {name} is not listed: {sorted(plugins)}"
    return plugins[name]


async def wait_state(
    channel: grpc.aio.Channel,
    name: str,
    states: Collection[reg.PluginState.ValueType] = (reg.PLUGIN_STATE_READY,),
    seconds: float = T,
) -> reg.Plugin:
    """Wait until ListPlugins shows the plugin in one of `states` (default READY); returns it."""

    async def reached() -> bool:
        plugins = await list_plugins(channel)
        return name in plugins and plugins[name].state in states

    names = "/".join(reg.PluginState.Name(state) for state in states)
    await eventually(reached, f"plugin {name} to be {names}", seconds)
    return await plugin_state(channel, name)


async def register(
    channel: grpc.aio.Channel,
    address: str,
    *,
    order: int | None = None,
    deadline: float | None = None,
    failure_policy: hk.FailurePolicy.ValueType = hk.FAILURE_POLICY_UNSPECIFIED,
) -> reg.Plugin:
    """RegisterPlugin, then wait until the plugin is READY; returns it."""
    plugin = await _client(channel).register_plugin(
        address, order=order, deadline=deadline, failure_policy=failure_policy
    )
    assert plugin.address == address
    return await wait_state(channel, plugin.name)


async def unregister(channel: grpc.aio.Channel, name: str) -> None:
    """UnregisterPlugin."""
    await _client(channel).unregister_plugin(name)
