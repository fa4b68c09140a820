"""The CLI's `drain` verb: hand a replica's agents over to the others, then stop it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from agentloop.cli.verbs import emit
from agentloop.client import Client


async def cmd_drain(client: Client, args: argparse.Namespace) -> int:
    """`drain [REPLICA]`: answered once every agent is handed over (turns end first)."""
    response = await client.drain(args.replica_id)
    moved = ", ".join(response.agent_ids) or "none"
    emit(
        args,
        response,
        f"drained {response.replica_id}: {len(response.agent_ids)} agent(s) handed over"
        f" ({moved}); it stops now\n",
    )
    return 0


def add_drain_verb(command: Callable[[str, Any, str], argparse.ArgumentParser]) -> None:
    """Add `drain` through the CLI's `command(name, handler, help)`."""
    drain = command(
        "drain", cmd_drain, "hand a replica's agents over to the other replicas, then stop it"
    )
    drain.add_argument(
        "replica_id", metavar="REPLICA", nargs="?", default="",
        help="the replica's id (default: the one --address reaches)",
    )  # fmt: skip
