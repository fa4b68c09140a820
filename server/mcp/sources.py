"""The configured MCP servers of one agentloop server, started and stopped with it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from server.kernel.tools import ToolRegistry
from server.mcp import naming
from server.settings.mcp_servers import McpServerConfig

if TYPE_CHECKING:
    from server.mcp.source import McpSource

START_WAIT_SECONDS = 10.0
"""How long the start waits for the servers' first connections (then they go on trying)."""


class McpSources:
    """Every configured MCP server as a tool source."""

    def __init__(self, configs: Sequence[McpServerConfig], registry: ToolRegistry) -> None:
        self.sources: dict[str, McpSource] = {}
        if configs:  # importing the MCP SDK costs ~2 s of CPU: only when used
            from server.mcp.source import McpSource

            self.sources = {config.name: McpSource(config, registry) for config in configs}
        self._registry = registry
        self._dispose_rule: Callable[[], None] | None = None

    async def start(self, wait: float = START_WAIT_SECONDS) -> None:
        """Connect to every server, waiting (bounded) for the first connections.

        Agents may name `mcp:<server>/...` from now on, connected or not: the tools
        appear when their server answers.
        """
        if not self.sources:
            return
        names = tuple(self.sources)
        self._dispose_rule = self._registry.name_rule(lambda name: naming.accepts(name, names))
        for source in self.sources.values():
            source.start()
        await asyncio.gather(*(s.wait_connected(wait) for s in self.sources.values()))

    def describe(self) -> list[reg.ToolSource]:
        """Each server as `ListToolSources` shows it, by name."""
        return [source.describe() for _, source in sorted(self.sources.items())]

    async def close(self) -> None:
        """Disconnect every server and withdraw its tools."""
        await asyncio.gather(*(s.close() for s in self.sources.values()))
        if self._dispose_rule is not None:
            self._dispose_rule()
