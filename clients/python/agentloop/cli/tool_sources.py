"""The CLI's `mcp` verb: the MCP servers of the server's config (`ListToolSources`).

One row per server: its state, how many times it was restarted or reconnected, the
protocol revision it speaks, how many tools it offers, its transport and endpoint;
the last error under its row. `--tools` lists the model names of its tools too.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from agentloop.cli import render
from agentloop.cli.verbs import as_dict, emit
from agentloop.client import Client
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg

HEADINGS = ("MCP SERVER", "STATE", "RESTARTS", "PROTOCOL", "TOOLS", "TRANSPORT", "ENDPOINT")


def state_word(state: reg.PluginState.ValueType) -> str:
    """The lowercase word of a source's state, e.g. "ready"."""
    return render.word_of(reg.PluginState.Name, state, "PLUGIN_STATE_")


def sources_text(sources: Iterable[reg.ToolSource], with_tools: bool) -> str:
    """The sources as a left-aligned table; errors (and, `with_tools`, tools) below each row."""
    listed = list(sources)
    if not listed:
        return "no MCP servers configured (mcpServers in the server's config)\n"
    rows = [HEADINGS]
    rows += [
        (
            s.name,
            state_word(s.state),
            str(s.restarts),
            s.protocol or "-",
            str(len(s.tools)),
            s.transport,
            s.endpoint,
        )
        for s in listed
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADINGS) - 1)]

    def line(row: tuple[str, ...]) -> str:
        cells = [f"{cell:<{width}}" for cell, width in zip(row, widths, strict=False)]
        return "  ".join([*cells, row[-1]]).rstrip()

    lines = [line(rows[0])]
    for source, row in zip(listed, rows[1:], strict=True):
        lines.append(line(row))
        if source.last_error:
            lines.append(f"  last error: {source.last_error}")
        if with_tools:
            lines += [f"  {tool}" for tool in source.tools]
    return "\n".join(lines) + "\n"


async def cmd_mcp(client: Client, args: argparse.Namespace) -> int:
    """`mcp [--tools]`: the server's MCP servers, their state, restarts and protocol."""
    sources = await client.tool_sources()
    data = {"sources": [as_dict(s) for s in sources]}
    emit(args, data, sources_text(sources, args.tools))
    return 0


def add_mcp_verb(command: Callable[[str, Any, str], argparse.ArgumentParser]) -> None:
    """Add `mcp` through the CLI's `command(name, handler, help)`."""
    mcp = command("mcp", cmd_mcp, "list the server's MCP servers (tool sources)")
    mcp.add_argument("--tools", action="store_true", help="list each server's tools too")
