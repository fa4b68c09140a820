"""The `acp` verb: its flags, the agents' options they make, and the bridge it runs.

The bridge (`agentloop.cli.acp_agent`) is imported when the verb runs: the ACP SDK's
schema costs about a second and a half of CPU to import, which no other verb should pay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format

from agentloop.client import Client
from agentloop.v1 import agent_pb2, scripted_pb2  # noqa: F401  (the profile's Any resolves)


def profile(args: Any) -> agent_pb2.AgentOptions | None:
    """The agent options of `agentloop acp`: a JSON profile, then the flags over it.

    None (the server's defaults) when neither is given. The profile is `AgentOptions`
    in protobuf's JSON form; a scripted model's script (`provider_options`) resolves
    because the contract's scripted options are imported here.
    """
    options: agent_pb2.AgentOptions | None = None
    if args.profile:
        options = json_format.Parse(Path(args.profile).read_text(), agent_pb2.AgentOptions())
    flags = agent_pb2.AgentOptions(
        provider=args.provider, model=args.model, tools=args.tool, persona=args.persona,
        approval_required_tools=args.approval_required,
    )  # fmt: skip
    if flags.ByteSize():
        options = options or agent_pb2.AgentOptions()
        options.MergeFrom(flags)
    return options


async def cmd_acp(client: Client, args: Any) -> int:
    """`acp`: serve ACP on stdin/stdout until the editor closes stdin."""
    options = profile(args)
    from agentloop.cli.acp_agent import serve

    await serve(client, options)
    return 0


def add_acp_verb(command: Any) -> None:
    """Add `acp` through the CLI's `command(...)`."""
    acp = command("acp", cmd_acp, "be an Agent Client Protocol agent on stdio (for editors)")
    acp.add_argument(
        "--profile", default="", metavar="FILE",
        help="the agents' options: AgentOptions as JSON (default: the server's)",
    )  # fmt: skip
    acp.add_argument("--provider", default="", help="model provider (over the profile's)")
    acp.add_argument("--model", default="", help="model name (over the profile's)")
    acp.add_argument(
        "--tool", action="append", default=[], metavar="NAME", help="a tool (repeatable)"
    )
    acp.add_argument("--persona", default="", help="persona section of the system prompt")
    acp.add_argument(
        "--approval-required", action="append", default=[], metavar="TOOL",
        help="a tool whose every call asks the editor first (repeatable)",
    )  # fmt: skip
