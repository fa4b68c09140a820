"""The CLI's `compact` verb: summarise an idle agent's older history (CompactAgent)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from agentloop.cli.verbs import emit
from agentloop.client import Client


async def cmd_compact(client: Client, args: argparse.Namespace) -> int:
    """`compact AGENT_ID [--instructions TEXT] [--keep-recent-tokens N]`."""
    response = await client.compact(
        args.agent_id, args.instructions, keep_recent_tokens=args.keep_recent_tokens
    )
    if not response.compacted:
        emit(args, response, f"nothing compacted: {response.reason}\n")
        return 0
    info = response.compaction
    emit(
        args,
        response,
        f"compacted {info.replaced_nodes} history nodes into one summary (seq"
        f" {response.event_seq}): about {info.tokens_before} -> {info.tokens_after} tokens\n",
    )
    return 0


def add_compact_verb(command: Callable[[str, Any, str], argparse.ArgumentParser]) -> None:
    """Add `compact` through the CLI's `command(name, handler, help)`."""
    compact = command("compact", cmd_compact, "summarise an idle agent's older history")
    compact.add_argument("agent_id", metavar="AGENT_ID")
    compact.add_argument("--instructions", default="", help='what to focus on ("the open bugs")')
    compact.add_argument(
        "--keep-recent-tokens", type=int, metavar="N",
        help="recent history kept verbatim (default: the agent's; 0 summarises all)",
    )  # fmt: skip
