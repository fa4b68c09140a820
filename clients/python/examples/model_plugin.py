r"""An example model provider served by a plugin: "plugin-echo", deterministic and offline.

The plugin "model-echo" serves the provider "plugin-echo", whose one model "reverse"
(the default) answers with the user's last message reversed, streamed a few characters
at a time. When that message asks "what time" and the request offers the tool
`current_time`, it calls the tool first, then answers "It is <time>".

Run it, register it with the server, then create an agent with
`options.provider = "plugin-echo"`:

    python clients/python/examples/model_plugin.py --listen 127.0.0.1:50102
    G=".venv/bin/grpcurl -plaintext"
    $G -d '{"address": "127.0.0.1:50102"}' 127.0.0.1:50051 \
        agentloop.plugin.v1.PluginRegistryService/RegisterPlugin
    $G -d '{"agent_id": "echo", "options": {"provider": "plugin-echo"}}' 127.0.0.1:50051 \
        agentloop.v1.AgentFactoryService/CreateAgent
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator

from agentloop.plugin.sdk import (
    ERROR,
    Plugin,
    finish_chunk,
    last_user_text,
    text_chunks,
    text_of,
    tool_call_chunks,
    usage_chunk,
)
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import content_pb2, stream_pb2

PROVIDER = "plugin-echo"
MODEL = "reverse"
TIME_TOOL = "current_time"
CHUNK_SIZE = 3
"""Characters per text delta."""


def build_plugin(chunk_delay: float = 0.0, token: str | None = None) -> Plugin:
    """The plugin; `chunk_delay` seconds pass before each text delta."""
    plugin = Plugin("model-echo", version="1.0", token=token)

    @plugin.model(PROVIDER, default_model=MODEL)
    async def reverse(call: hs.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
        request = call.model_stream
        if request.header.config.model != MODEL:
            yield finish_chunk(ERROR, f"unknown model {request.header.config.model!r}", "MODEL")
            return
        messages = list(request.messages)
        time = _time_result(messages[-1]) if messages else None
        asked = last_user_text(messages)
        offered = {tool.name for tool in request.header.tools}
        if time is None and "what time" in asked.lower() and TIME_TOOL in offered:
            for chunk in tool_call_chunks(f"time_{call.turn}_{call.step}", TIME_TOOL, {}):
                yield chunk
            yield usage_chunk(input_tokens=len(asked) // 4)
            return  # the finish STOP is appended
        reply = f"It is {time}" if time is not None else asked[::-1]
        for chunk in text_chunks(reply, chunk_size=CHUNK_SIZE):
            if chunk_delay > 0 and chunk.HasField("block_delta"):
                await asyncio.sleep(chunk_delay)
            yield chunk
        yield usage_chunk(input_tokens=len(asked) // 4, output_tokens=len(reply) // 4)
        yield finish_chunk()

    return plugin


def _time_result(message: content_pb2.Message) -> str | None:
    """The text of a `current_time` result this model asked for, when `message` has one."""
    for block in message.content:
        result = block.tool_result
        if block.WhichOneof("block") == "tool_result" and result.tool_call_id.startswith("time_"):
            return text_of(result.content)
    return None


def main() -> None:
    """Parse the command line and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:50102", help="host:port (port 0: any)")
    parser.add_argument(
        "--chunk-delay",
        type=float,
        default=0.0,
        help="seconds to wait before each text delta (default 0)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("AGENTLOOP_PLUGIN_TOKEN"),
        help="require 'authorization: Bearer TOKEN' (default: $AGENTLOOP_PLUGIN_TOKEN)",
    )
    args = parser.parse_args()
    build_plugin(args.chunk_delay, args.token).run(args.listen)


if __name__ == "__main__":
    main()
