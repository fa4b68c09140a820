"""The names of MCP tools: what the model calls, and what an agent opts in with.

The model sees `mcp__<server>__<tool>` (letters, digits, `_` and `-` only, as providers
require). An agent enables a tool by that name, by `mcp:<server>/<tool>`, or by a
pattern over the latter (`mcp:files/*`, `mcp:*/read_*`; `fnmatch` rules).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from fnmatch import fnmatchcase

PREFIX = "mcp:"
MODEL_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
MAX_MODEL_NAME = 64
"""The longest tool name the providers take."""


def model_name(server: str, tool: str) -> str:
    """The name the model calls `tool` of `server` by (other characters become `_`)."""
    return MODEL_NAME_CHARS.sub("_", f"mcp__{server}__{tool}")[:MAX_MODEL_NAME]


def opt_in_name(server: str, tool: str) -> str:
    """`mcp:<server>/<tool>`: how an agent's `tools` names it."""
    return f"{PREFIX}{server}/{tool}"


def enables(server: str, tool: str, enabled: Collection[str]) -> bool:
    """Whether an agent's enabled names turn this tool on (by opt-in name or pattern)."""
    name = opt_in_name(server, tool)
    return any(n.startswith(PREFIX) and fnmatchcase(name, n) for n in enabled)


def accepts(name: str, servers: Collection[str]) -> bool:
    """Whether `name` is an opt-in an agent may give.

    That is `mcp:<server>/<tool or pattern>` whose server part names (or matches) a
    configured server.
    """
    if not name.startswith(PREFIX) or "/" not in name:
        return False
    server, _, tool = name.removeprefix(PREFIX).partition("/")
    return bool(tool) and any(fnmatchcase(s, server) for s in servers)
