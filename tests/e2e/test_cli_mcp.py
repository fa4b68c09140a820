"""`agentloop mcp` as a real subprocess against a real server with real MCP servers.

The server starts two stdio MCP servers: the test toolbox (`tests/mcp_toolbox.py`),
which connects, and a command that does not exist, which never does and is retried.
"""

from __future__ import annotations

import json
from pathlib import Path

from server.settings.mcp_servers import McpServerConfig
from tests.e2e.registry import eventually
from tests.e2e.test_mcp_tools import READY, STARTUP, UNAVAILABLE, serving, stdio_box, tool_sources
from tests.test_cli import run_cli

MISSING = McpServerConfig(name="gone", command="/nonexistent/mcp-server")
"""A stdio server whose command is not there: each start fails, and is retried."""


async def test_mcp_lists_each_server_with_state_restarts_protocol_and_tools(
    tmp_path: Path,
) -> None:
    async with serving(stdio_box(tmp_path), MISSING, ready=False) as e2e:

        async def settled() -> bool:
            by_name = {s.name: s for s in await tool_sources(e2e)}
            gone = by_name["gone"]
            return by_name["box"].state == READY and gone.state == UNAVAILABLE and gone.restarts > 0

        await eventually(settled, "box to connect and gone to fail twice", seconds=STARTUP)
        address = f"127.0.0.1:{e2e.port}"

        listed = await run_cli(address, "--json", "mcp")
        assert listed.code == 0, listed.stderr
        [line] = listed.stdout.splitlines()
        box, gone = json.loads(line)["sources"]  # sorted by name, as the server lists them
        assert (box["name"], box["state"]) == ("box", "PLUGIN_STATE_READY")
        assert box["transport"] == "stdio"
        assert box["protocol"] and box["last_error"] == ""
        assert "mcp__box__echo" in box["tools"]
        assert (gone["name"], gone["state"]) == ("gone", "PLUGIN_STATE_UNAVAILABLE")
        assert gone["restarts"] >= 1 and gone["last_error"] and gone["protocol"] == ""

        table = await run_cli(address, "mcp", "--tools")
        assert table.code == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == [
            "MCP", "SERVER", "STATE", "RESTARTS", "PROTOCOL", "TOOLS", "TRANSPORT", "ENDPOINT",
        ]  # fmt: skip
        box_row = lines[1].split()
        assert box_row[:4] == ["box", "ready", str(box["restarts"]), box["protocol"]]
        assert box_row[4:6] == [str(len(box["tools"])), "stdio"]
        assert "  mcp__box__echo" in lines  # --tools: one line per tool under its server
        at = next(i for i, line in enumerate(lines) if line.startswith("gone "))
        _, state, restarts, protocol, tools, transport = lines[at].split()[:6]
        assert (state, protocol, tools, transport) == ("unavailable", "-", "0", "stdio")
        assert int(restarts) >= 1
        assert lines[at + 1].startswith("  last error: ") and len(lines[at + 1]) > 14


async def test_mcp_says_when_no_server_is_configured(tmp_path: Path) -> None:
    async with serving() as e2e:
        listed = await run_cli(f"127.0.0.1:{e2e.port}", "mcp")
        assert listed.code == 0, listed.stderr
        assert listed.stdout == "no MCP servers configured (mcpServers in the server's config)\n"
