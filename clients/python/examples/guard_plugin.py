r"""An example agentloop plugin: a prompt guard, a clock note and a `shout` tool.

- `agent/prompt-submit`: blocks a prompt containing "rm -rf"; any other prompt is
  allowed with a context note carrying the plugin's clock.
- the tool `shout` (parallel-safe) upper-cases its `text` argument.

Run it, then register it with the server:

    python clients/python/examples/guard_plugin.py --listen 127.0.0.1:50100
    G=".venv/bin/grpcurl -plaintext"
    $G -d '{"address": "127.0.0.1:50100"}' 127.0.0.1:50051 \
        agentloop.plugin.v1.PluginRegistryService/RegisterPlugin
"""

from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime
from typing import Any

from agentloop.plugin.sdk import Plugin, allow_prompt, block_prompt, context, text_of
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import content_pb2, decision_pb2

SHOUT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "The text to shout."}},
    "required": ["text"],
}


def build_plugin(token: str | None = None) -> Plugin:
    """The guard plugin; `token`, when set, is required from the server."""
    plugin = Plugin("guard", version="1.0", token=token)
    source = content_pb2.Source(kind="plugin", name=plugin.name)

    @plugin.prompt_submit(order=10)
    async def guard(call: hs.HookCall) -> decision_pb2.PromptDecision:
        if "rm -rf" in text_of(call.prompt_submit.content):
            return block_prompt("destructive command")
        now = datetime.now(UTC).isoformat(timespec="seconds")
        return allow_prompt(contexts=[context(f"The plugin's clock reads {now}.", source)])

    @plugin.tool("shout", description="Upper-cases text.", schema=SHOUT_SCHEMA, parallel_safe=True)
    async def shout(args: Any, call: hs.HookCall) -> str:
        return str(args["text"]).upper()

    return plugin


def main() -> None:
    """Parse the command line and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:50100", help="host:port (port 0: any)")
    parser.add_argument(
        "--token",
        default=os.environ.get("AGENTLOOP_PLUGIN_TOKEN"),
        help="require 'authorization: Bearer TOKEN' (default: $AGENTLOOP_PLUGIN_TOKEN)",
    )
    parser.add_argument("--tls-key", default="", help="serve TLS: the private key (PEM)")
    parser.add_argument("--tls-cert", default="", help="serve TLS: the certificate (PEM)")
    args = parser.parse_args()
    build_plugin(args.token).run(args.listen, tls_key=args.tls_key, tls_cert=args.tls_cert)


if __name__ == "__main__":
    main()
