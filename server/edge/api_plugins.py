"""The `PluginRegistryService` servicer: a thin adapter over `PluginRegistry`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import plugin_registry_service_pb2 as pb
from agentloop.plugin.v1 import plugin_registry_service_pb2_grpc as rpc
from server.edge.status import mapped
from server.kernel.errors import InvalidArgument
from server.loop.validation import duration_seconds
from server.plugins.registry import Overrides, PluginRegistry, describe

Context = grpc.aio.ServicerContext[Any, Any]

MAX_TIMEOUT_SECONDS = 3600
"""The longest plugin call deadline an operator may set."""

if TYPE_CHECKING:
    from server.stores.postgres_plugins import SharedPlugins  # replicas only


def overrides_of(request: pb.RegisterPluginRequest) -> Overrides:
    """The operator's overrides of a registration, validated."""
    if not request.address:
        raise InvalidArgument("address", "must not be empty")
    timeout = (
        duration_seconds(request.timeout, "timeout", MAX_TIMEOUT_SECONDS)
        if request.HasField("timeout")
        else None
    )
    if timeout is not None and timeout <= 0:
        raise InvalidArgument("timeout", "must be positive")
    if request.failure_policy not in hk.FailurePolicy.values():
        raise InvalidArgument(
            "failure_policy", f"{request.failure_policy} is not a known failure policy"
        )
    return Overrides(
        order=request.order if request.HasField("order") else None,
        timeout=timeout,
        failure_policy=request.failure_policy,
    )


class PluginRegistryServicer(rpc.PluginRegistryServiceServicer):
    """Registers, lists and unregisters plugins."""

    def __init__(self, registry: PluginRegistry) -> None:
        self.registry = registry
        self.shared: SharedPlugins | None = None
        """Replicas: registrations kept in the store, so that every replica connects."""
        self.tool_sources: Callable[[], list[pb.ToolSource]] = list
        """The configured MCP servers as `ToolSource`s (the app sets it)."""

    @mapped
    async def RegisterPlugin(
        self, request: pb.RegisterPluginRequest, context: Context
    ) -> pb.RegisterPluginResponse:
        """Connect to a plugin, describe it and subscribe it (on every replica)."""
        plugin = await self.registry.register(request.address, overrides_of(request))
        if self.shared is not None:
            await self.shared.add(plugin.name, request)
        return pb.RegisterPluginResponse(plugin=describe(plugin))

    @mapped
    async def UnregisterPlugin(
        self, request: pb.UnregisterPluginRequest, context: Context
    ) -> pb.UnregisterPluginResponse:
        """Remove a plugin (from every replica)."""
        if not request.name:
            raise InvalidArgument("name", "must not be empty")
        if self.shared is not None:  # first: the sync must not bring it back meanwhile
            await self.shared.remove(request.name)
        await self.registry.unregister(request.name)
        return pb.UnregisterPluginResponse()

    @mapped
    async def ListPlugins(
        self, request: pb.ListPluginsRequest, context: Context
    ) -> pb.ListPluginsResponse:
        """List the plugins with their state and counters."""
        return pb.ListPluginsResponse(plugins=self.registry.list_plugins())

    @mapped
    async def ListToolSources(
        self, request: pb.ListToolSourcesRequest, context: Context
    ) -> pb.ListToolSourcesResponse:
        """List the configured MCP servers, their state and their tools."""
        return pb.ListToolSourcesResponse(sources=self.tool_sources())
