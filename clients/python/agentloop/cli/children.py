"""The CLI's sub-agent verb: an agent's children, or its whole tree (`children`).

The tree is read top-down with ListAgents' parent filter, one call per agent that has
children; each line shows the agent, its status, the tool call that made it and its
session (follow it with `agentloop tail --session-id`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from agentloop.cli import render
from agentloop.cli.verbs import as_dict, emit
from agentloop.client import Client
from agentloop.v1 import agent_pb2


async def tree_of(client: Client, agent_id: str, deep: bool) -> list[tuple[int, agent_pb2.Agent]]:
    """(depth below `agent_id`, agent) of its children, depth first; all levels if `deep`."""
    found: list[tuple[int, agent_pb2.Agent]] = []

    async def below(parent: str, depth: int) -> None:
        for child in await client.list_agents(parent_agent_id=parent):
            found.append((depth, child))
            if deep and child.lineage.child_agent_ids:
                await below(child.agent_id, depth + 1)

    await below(agent_id, 1)
    return found


def tree_text(root: agent_pb2.Agent, rows: list[tuple[int, agent_pb2.Agent]]) -> str:
    """The tree drawn with branches, one agent a line."""
    lines = [f"{root.agent_id}  {render.status_word(root.status)}  {root.session_id}"]
    open_levels: list[bool] = []  # per level above a row: whether a sibling still follows
    for index, (depth, agent) in enumerate(rows):
        last = _last_sibling(rows, index)
        del open_levels[depth - 1 :]
        rails = "".join("│  " if more else "   " for more in open_levels)
        open_levels.append(not last)
        call = agent.lineage.parent_tool_call_id
        made = f"  (call {call})" if call else ""
        lines.append(
            f"{rails}{'└─' if last else '├─'} {agent.agent_id}  "
            f"{render.status_word(agent.status)}  {agent.session_id}{made}"
        )
    return "\n".join(lines) + "\n"


def _last_sibling(rows: list[tuple[int, agent_pb2.Agent]], index: int) -> bool:
    """Whether no sibling of row `index` follows it (before its parent's level ends)."""
    depth = rows[index][0]
    for later, _ in rows[index + 1 :]:
        if later <= depth:
            return later < depth
    return True


async def cmd_children(client: Client, args: argparse.Namespace) -> int:
    """`children AGENT_ID [--tree]`: the agent's live sub-agents (all levels with --tree)."""
    root = await client.get_agent(args.agent_id)
    rows = await tree_of(client, args.agent_id, args.tree)
    data = {
        "agent": as_dict(root),
        "children": [as_dict(agent) | {"depth": depth} for depth, agent in rows],
    }
    emit(args, data, tree_text(root, rows) if rows or args.tree else "no sub-agents\n")
    return 0


def add_children_verb(command: Callable[[str, Any, str], argparse.ArgumentParser]) -> None:
    """Add `children` through the CLI's `command(name, handler, help)`."""
    children = command("children", cmd_children, "list an agent's sub-agents (--tree: all)")
    children.add_argument("agent_id", metavar="AGENT_ID")
    children.add_argument("--tree", action="store_true", help="every level, as a tree")
