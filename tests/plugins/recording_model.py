r"""A test plugin whose model records what each call carried (used by tests/e2e).

    python tests/plugins/recording_model.py --listen 127.0.0.1:0 --record-file PATH

prints `plugin recording-model listening on HOST:PORT`, then serves until SIGTERM.

Its provider "recorder" (model "m") appends to PATH, per call, one line: the call's
`model_stream` serialized deterministically, in hex. It answers a history ending in a
user's text with a call of the tool `word_count` on that text, and one ending in a tool
result with the text "counted RESULT".

It also composes the session prefix (a message "PREFIX" ahead of the one received) and
rewrites every assistant text on `agent/step-result` to "REWRITTEN: TEXT", so that the
requests after it show whether the rewrite reached them.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

from agentloop.plugin.sdk import (
    Plugin,
    replace_message,
    replace_prefix,
    text_block,
    text_chunks,
    text_of,
    tool_call_chunks,
)
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import content_pb2, stream_pb2


def append(path: str, line: str) -> None:
    """Append one line to the file `path` (small, local: blocking is fine here)."""
    with open(path, "a") as file:
        file.write(line + "\n")


def build(record_file: str) -> Plugin:
    plugin = Plugin("recording-model", version="1.0")

    @plugin.model("recorder", default_model="m")
    async def recorder(call: hs.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
        append(record_file, call.model_stream.SerializeToString(deterministic=True).hex())
        last = call.model_stream.messages[-1]
        results = [b.tool_result for b in last.content if b.HasField("tool_result")]
        if results:
            for chunk in text_chunks(f"counted {text_of(results[0].content)}"):
                yield chunk
            return
        call_id = f"w_{call.turn}_{call.step}"
        for chunk in tool_call_chunks(call_id, "word_count", {"text": text_of(last.content)}):
            yield chunk

    @plugin.session_prefix()
    async def prefix(call: hs.HookCall) -> hs.SessionPrefixResult:
        mine = content_pb2.Message(role=content_pb2.ROLE_USER, content=[text_block("PREFIX")])
        return replace_prefix([mine, *call.session_prefix.prefix])

    @plugin.step_result()
    async def rewrite(call: hs.HookCall) -> hs.StepResultResult | None:
        message = call.step_result.message
        said = text_of(message.content)
        if not said:
            return None
        calls = [b for b in message.content if b.HasField("tool_call")]
        return replace_message([text_block(f"REWRITTEN: {said}"), *calls])

    return plugin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--record-file", required=True)
    args = parser.parse_args()
    build(args.record_file).run(args.listen)


if __name__ == "__main__":
    main()
