r"""An example compactor plugin: it writes compactions' summaries without a model.

- `agent/compact`: the summary keeps what the user said (each message cut to
  `--max-chars`) and the focus instructions, and drops the rest: an extractive
  summariser, cheap and deterministic. Each summary's size is printed to stdout.

Run it, then register it with the server (every agent's compactions then use it):

    python clients/python/examples/compactor_plugin.py --listen 127.0.0.1:50104
    G=".venv/bin/grpcurl -plaintext"
    $G -d '{"address": "127.0.0.1:50104"}' 127.0.0.1:50051 \
        agentloop.plugin.v1.PluginRegistryService/RegisterPlugin
"""

from __future__ import annotations

import argparse
import os

from agentloop.plugin.sdk import Plugin
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import content_pb2 as c


def build_plugin(max_chars: int = 200, token: str | None = None) -> Plugin:
    """The compactor; `token`, when set, is required from the server."""
    plugin = Plugin("compactor", version="1.0", token=token)

    @plugin.compact()
    async def summarise(call: hs.HookCall) -> hs.CompactResult:
        said = [
            "".join(b.text.text for b in m.content if b.WhichOneof("block") == "text")
            for m in call.compact.messages
            if m.role == c.ROLE_USER
        ]
        lines = [f"- {text[:max_chars]}" for text in said if text]
        summary = "Earlier, the user said:\n" + "\n".join(lines)
        if call.compact.instructions:
            summary += f"\nFocus: {call.compact.instructions}"
        print(f"summary {len(call.compact.messages)} messages {len(summary)} chars", flush=True)
        return hs.CompactResult(summary=summary)

    return plugin


def main() -> None:
    """Parse the command line and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:50104", help="host:port (port 0: any)")
    parser.add_argument("--max-chars", type=int, default=200, help="each user message's share")
    parser.add_argument(
        "--token",
        default=os.environ.get("AGENTLOOP_PLUGIN_TOKEN"),
        help="require 'authorization: Bearer TOKEN' (default: $AGENTLOOP_PLUGIN_TOKEN)",
    )
    args = parser.parse_args()
    build_plugin(args.max_chars, args.token).run(args.listen)


if __name__ == "__main__":
    main()
