r"""An example agentloop plugin that builds a team: a tool that asks a sub-agent.

The tool `ask_team` hands a task to a sub-agent of the calling agent, over the plain
API, and answers with the child's reply.

The same as the built-in `delegate` tool, from outside the server: `CreateAgent` with
`parent` (the calling agent, and this call's id), `SendMessage`, `WaitIdle`, the
child's last answer from `ListSessionEvents` of its session, `DisposeAgent`. The child
shows its parent in `GetAgent`, and is disposed with it if the parent goes first.

Run it, then register it with the server:

    python clients/python/examples/team_plugin.py --listen 127.0.0.1:50101 \
        --server 127.0.0.1:50051
    G=".venv/bin/grpcurl -plaintext"
    $G -d '{"address": "127.0.0.1:50101"}' 127.0.0.1:50051 \
        agentloop.plugin.v1.PluginRegistryService/RegisterPlugin
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from agentloop.client import connect
from agentloop.plugin.sdk import Plugin
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2
from agentloop.v1 import agent_service_pb2 as api

TASK_SCHEMA = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "What the helper must do."}},
    "required": ["task"],
}


def build_plugin(server: str) -> Plugin:
    """The team plugin, calling back into the server at `server` (host:port)."""
    plugin = Plugin("team", version="1.0")

    @plugin.tool("ask_team", description="Asks a helper agent.", schema=TASK_SCHEMA)
    async def ask_team(args: Any, call: hs.HookCall) -> str:
        client = connect(server)
        try:
            call_id = call.tool_execute.invocation.call_id
            child_id = f"{call.agent_id}.team-{re.sub(r'[^A-Za-z0-9._:-]', '-', call_id)}"
            await client.factory.CreateAgent(
                fac.CreateAgentRequest(
                    agent_id=child_id,
                    options=agent_pb2.AgentOptions(provider="scripted"),
                    parent=fac.AgentParent(agent_id=call.agent_id, tool_call_id=call_id),
                )
            )
            try:
                await client.agents.SendMessage(
                    api.SendMessageRequest(agent_id=child_id, text=str(args["task"]))
                )
                await client.wait_idle(child_id)
                page = await client.agents.ListSessionEvents(
                    api.ListSessionEventsRequest(agent_id=child_id, page_size=1000)
                )
                answers = [
                    block.text.text
                    for event in page.events
                    if event.HasField("assistant_message")
                    for block in event.assistant_message.content
                    if block.HasField("text")
                ]
                return f"{child_id} answered: {answers[-1] if answers else '(nothing)'}"
            finally:
                await client.dispose(child_id)
        finally:
            await client.close()

    return plugin


def main() -> None:
    """Parse the command line and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:50101", help="host:port (port 0: any)")
    parser.add_argument("--server", default="127.0.0.1:50051", help="the agentloop server")
    args = parser.parse_args()
    build_plugin(args.server).run(args.listen)


if __name__ == "__main__":
    main()
