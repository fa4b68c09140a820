r"""An example approver plugin: it answers tool calls that wait for approval.

- `tools/approval`: a call to a tool named by `--allow` is allowed once; one named by
  `--reject` is rejected with `--reason`; any other call is left to others (the
  API, another approver, or the timeout). Each answer is printed to stdout.

Run it, then register it with the server (agents whose `approval_required_tools`
name a tool, or whose pre-execute listeners answer `ask`, then get its answers):

    python clients/python/examples/approver_plugin.py --listen 127.0.0.1:50102 \
        --allow word_count --reject sleep --reason "no sleeping on the job"
    G=".venv/bin/grpcurl -plaintext"
    $G -d '{"address": "127.0.0.1:50102"}' 127.0.0.1:50051 \
        agentloop.plugin.v1.PluginRegistryService/RegisterPlugin
"""

from __future__ import annotations

import argparse
import os

from agentloop.plugin.sdk import Plugin, approve_once, reject_tool
from agentloop.plugin.v1 import hook_service_pb2 as hs


def build_plugin(
    allow: set[str], reject: set[str], reason: str = "", token: str | None = None
) -> Plugin:
    """The approver; `token`, when set, is required from the server."""
    plugin = Plugin("approver", version="1.0", token=token)

    @plugin.tools_approval()
    async def answer(call: hs.HookCall) -> hs.ToolApprovalResult | None:
        approval = call.tool_approval.approval
        if approval.tool_name in allow:
            print(f"allow {approval.approval_id} {approval.tool_name}", flush=True)
            return approve_once()
        if approval.tool_name in reject:
            print(f"reject {approval.approval_id} {approval.tool_name}", flush=True)
            return reject_tool(reason)
        return None  # abstain

    return plugin


def main() -> None:
    """Parse the command line and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:50102", help="host:port (port 0: any)")
    parser.add_argument("--allow", action="append", default=[], help="a tool to allow once")
    parser.add_argument("--reject", action="append", default=[], help="a tool to reject")
    parser.add_argument("--reason", default="", help="the rejection reason the model sees")
    parser.add_argument(
        "--token",
        default=os.environ.get("AGENTLOOP_PLUGIN_TOKEN"),
        help="require 'authorization: Bearer TOKEN' (default: $AGENTLOOP_PLUGIN_TOKEN)",
    )
    args = parser.parse_args()
    build_plugin(set(args.allow), set(args.reject), args.reason, args.token).run(args.listen)


if __name__ == "__main__":
    main()
