"""The "scripted" provider: a deterministic, offline model driven by a script.

The script is the provider's own options (`ScriptedOptions` in
`AgentOptions.provider_options`). Call k of an agent (counted from 0, per agent)
answers with `steps[k]`. Once the script
is exhausted, or when there is none, the model falls back to a default behaviour that is
enough to demonstrate a turn end to end:

- after tool results, it summarises them: "Tool results: a; b";
- when a `word_count` tool is offered and the user just wrote text, it calls that tool;
- otherwise it echoes the latest user text: "You said: ...".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence

from agentloop.v1 import content_pb2, scripted_pb2, stream_pb2
from server.kernel.abort import AbortSignal
from server.kernel.content import plain_text
from server.models import ModelRequest
from server.models.scripted_options import OPTIONS_TYPE, script_of

DEFAULT_CHUNK_SIZE = 8
"""Characters per text delta in the default (unscripted) behaviour."""

GREETING = "Hello! Send me a message."
"""The default reply when there is no user text to echo."""

WORD_COUNT_TOOL = "word_count"
"""The tool the default behaviour calls when it is offered."""

COUNT_SLICE = 1024
"""Messages whose characters are counted between two yields to the event loop."""


class ScriptedModel:
    """A `Model` that replays each agent's script, then echoes."""

    options_type = OPTIONS_TYPE
    """The `provider_options` type this provider takes."""

    def __init__(self) -> None:
        self._calls: dict[str, int] = {}
        self._scripts: dict[str, tuple[bytes, Sequence[scripted_pb2.ScriptedStep]]] = {}
        """Per agent: its packed options and their script, unpacked once, not per call."""
        self._counted: dict[str, tuple[int, int]] = {}
        """Per agent: (messages already counted, their characters)."""

    def calls(self, agent_id: str) -> int:
        """How many calls this model has started for `agent_id`."""
        return self._calls.get(agent_id, 0)

    def release(self, agent_id: str) -> None:
        """Drop the cursor of `agent_id`: the agent was disposed, a new one starts afresh."""
        self._calls.pop(agent_id, None)
        self._counted.pop(agent_id, None)
        self._scripts.pop(agent_id, None)

    def _script(self, request: ModelRequest) -> Sequence[scripted_pb2.ScriptedStep]:
        """The agent's script, unpacked again only when its options changed."""
        packed = request.options.provider_options.SerializeToString()
        cached = self._scripts.get(request.agent_id)
        if cached is None or cached[0] != packed:
            cached = self._scripts[request.agent_id] = (packed, script_of(request.options))
        return cached[1]

    async def _input_chars(self, agent_id: str, messages: Sequence[content_pb2.Message]) -> int:
        """Characters of `messages`, counting only the new tail of an append-extended request.

        Requests of one agent append-extend the previous ones, so the count is carried
        over; a shorter request (after compaction, or another agent) is counted afresh,
        `COUNT_SLICE` messages at a time with the event loop running other tasks between
        two (a resumed long history's first request: 12,000 messages took 64 ms).
        """
        counted, chars = self._counted.get(agent_id, (0, 0))
        if counted > len(messages):
            counted, chars = 0, 0
        end = len(messages)
        while True:
            upto = min(counted + COUNT_SLICE, end)
            chars += sum(_text_chars(m.content) for m in messages[counted:upto])
            counted = upto
            if counted == end:
                break
            await asyncio.sleep(0)
        self._counted[agent_id] = (end, chars)  # kept when the count is whole
        return chars

    async def stream(
        self, request: ModelRequest, signal: AbortSignal
    ) -> AsyncIterator[stream_pb2.StreamChunk]:
        """Stream the chunks of one call; raises `Aborted` when `signal` fires.

        Args:
            request: The model call; the script in its provider options drives the answer.
            signal: Checked before every chunk; also interrupts a scripted `chunk_delay`.

        Yields:
            Block starts, deltas and ends, then usage (when there is any), then one finish.
        """
        if request.purpose == "compaction":  # not a call of the script: it never shifts it
            for chunk in summary_chunks(request):
                signal.raise_if_aborted()
                yield chunk
            return
        k = self._calls.get(request.agent_id, 0)
        self._calls[request.agent_id] = k + 1
        script = self._script(request)
        delay = 0.0
        if k < len(script):
            step = script[k]
            chunks = scripted_chunks(step, k)
            if step.HasField("chunk_delay"):
                delay = step.chunk_delay.seconds + step.chunk_delay.nanos / 1e9
        else:
            chunks = default_chunks(
                request, k, await self._input_chars(request.agent_id, request.messages)
            )
        for chunk in chunks:
            signal.raise_if_aborted()
            if delay > 0:
                await signal.race(asyncio.sleep(delay))
            yield chunk


def scripted_chunks(step: scripted_pb2.ScriptedStep, k: int) -> Iterable[stream_pb2.StreamChunk]:
    """The chunks of `step` answering call `k` (0-based) of an agent.

    Args:
        step: The scripted answer.
        k: The call index, used for default tool-call ids ("call_<k+1>_<j+1>").

    Returns:
        Reasoning, text and tool-call blocks (block indexes count from 0), the usage when
        the step sets one, and the finish.
    """
    out = _Chunks()
    size = step.chunk_size or 1
    out.block(stream_pb2.BLOCK_KIND_REASONING, _pieces(step.reasoning, size))
    out.block(stream_pb2.BLOCK_KIND_TEXT, _pieces(step.text, size))
    for j, call in enumerate(step.tool_calls):
        out.tool_call(call.id or f"call_{k + 1}_{j + 1}", call.name, call.arguments)
    if step.HasField("usage"):
        out.usage(step.usage)
    out.finish(
        stream_pb2.Finish(
            kind=step.finish or stream_pb2.FINISH_KIND_STOP,
            message=step.error_message,
            code=step.error_code,
        )
    )
    return out


def default_chunks(
    request: ModelRequest, k: int, input_chars: int | None = None
) -> Iterable[stream_pb2.StreamChunk]:
    """The unscripted answer to call `k`: summarise tool results, call word_count, or echo.

    Usage is always reported: input tokens are the characters of the request's messages
    divided by 4 (`input_chars` when the caller counted them), output tokens the
    characters of the reply (text or tool arguments) divided by 4.
    """
    messages = request.messages
    if input_chars is None:
        input_chars = sum(_text_chars(m.content) for m in messages)
    last = messages[-1] if messages else None
    out = _Chunks()
    reply: str
    if last is not None and last.role == content_pb2.ROLE_USER and _tool_results(last.content):
        results = _tool_results(last.content)
        reply = "Tool results: " + "; ".join(plain_text(r.content) for r in results)
        out.block(stream_pb2.BLOCK_KIND_TEXT, _pieces(reply, DEFAULT_CHUNK_SIZE))
    elif (
        last is not None
        and last.role == content_pb2.ROLE_USER
        and plain_text(last.content)
        and any(t.name == WORD_COUNT_TOOL for t in request.header.tools)
    ):
        reply = json.dumps({"text": plain_text(last.content)})
        out.tool_call(f"call_{k + 1}_1", WORD_COUNT_TOOL, reply)
    else:
        said = _latest_user_text(messages)
        reply = f"You said: {said}" if said else GREETING
        out.block(stream_pb2.BLOCK_KIND_TEXT, _pieces(reply, DEFAULT_CHUNK_SIZE))
    out.tokens(input_chars // 4, len(reply) // 4)
    out.stop()
    return out


SUMMARY_USER_LINES = 20
"""The latest user lines a scripted summary lists."""

SUMMARY_LINE_CHARS = 100
"""Each listed line's share of a scripted summary."""


def summary_chunks(request: ModelRequest) -> Iterable[stream_pb2.StreamChunk]:
    """The scripted answer to a compaction request: a deterministic digest of the transcript.

    "Summary of N transcript lines. The user said: a | b. Focus: F." lists the latest
    `SUMMARY_USER_LINES` user lines (each cut to `SUMMARY_LINE_CHARS`) and echoes the
    caller's instructions, so that tests can tell what a summary covered.
    """
    text = plain_text(request.messages[-1].content) if request.messages else ""
    lines = text.splitlines()
    said = [line.removeprefix("[user] ")[:SUMMARY_LINE_CHARS] for line in lines
            if line.startswith("[user] ")]  # fmt: skip
    count = sum(1 for line in lines if line.startswith("["))
    reply = f"Summary of {count} transcript lines."
    if said:
        reply += " The user said: " + " | ".join(said[-SUMMARY_USER_LINES:]) + "."
    focus = [line.removeprefix("Focus on: ") for line in lines if line.startswith("Focus on: ")]
    if focus:
        reply += f" Focus: {focus[-1]}."
    out = _Chunks()
    out.block(stream_pb2.BLOCK_KIND_TEXT, _pieces(reply, DEFAULT_CHUNK_SIZE))
    out.usage(content_pb2.Usage(input_tokens=len(text) // 4, output_tokens=len(reply) // 4))
    out.finish(stream_pb2.Finish(kind=stream_pb2.FINISH_KIND_STOP))
    return out


class _Chunks:
    """Builds one stream, numbering blocks from 0; iterating it yields the chunks.

    Deltas are kept as (index, text) and made into messages only as they are streamed:
    building 100,000 delta messages up front held the event loop for half a second.
    """

    def __init__(self) -> None:
        self.chunks: list[stream_pb2.StreamChunk | tuple[int, str]] = []
        self._next_index = 0

    def __iter__(self) -> Iterator[stream_pb2.StreamChunk]:
        for item in self.chunks:
            if isinstance(item, tuple):
                # Set in place: a nested constructor call costs twice as much.
                chunk = stream_pb2.StreamChunk()
                delta = chunk.block_delta
                delta.index, delta.text = item
                yield chunk
            else:
                yield item

    def block(self, kind: stream_pb2.BlockKind.ValueType, pieces: list[str]) -> None:
        """A block of `kind` with one delta per piece; nothing when there are no pieces."""
        if not pieces:
            return
        index = self._open(kind)
        for piece in pieces:
            self._delta(index, piece)
        self._close(index)

    def tool_call(self, call_id: str, name: str, arguments: str) -> None:
        """A tool-call block whose arguments arrive as one delta (none when empty)."""
        index = self._open(stream_pb2.BLOCK_KIND_TOOL_CALL, call_id, name)
        if arguments:
            self._delta(index, arguments)
        self._close(index)

    def usage(self, usage: content_pb2.Usage) -> None:
        """A usage chunk."""
        self.chunks.append(stream_pb2.StreamChunk(usage=usage))

    def tokens(self, input_tokens: int, output_tokens: int) -> None:
        """A usage chunk of these counts (built in place: no `Usage` copied in)."""
        chunk = stream_pb2.StreamChunk()
        usage = chunk.usage
        usage.input_tokens, usage.output_tokens = input_tokens, output_tokens
        self.chunks.append(chunk)

    def finish(self, finish: stream_pb2.Finish) -> None:
        """The finish chunk."""
        self.chunks.append(stream_pb2.StreamChunk(finish=finish))

    def stop(self) -> None:
        """A `FINISH_KIND_STOP` finish chunk."""
        chunk = stream_pb2.StreamChunk()
        chunk.finish.kind = stream_pb2.FINISH_KIND_STOP
        self.chunks.append(chunk)

    def _open(self, kind: stream_pb2.BlockKind.ValueType, call_id: str = "", name: str = "") -> int:
        index = self._next_index
        self._next_index += 1
        chunk = stream_pb2.StreamChunk()
        start = chunk.block_start
        start.index, start.kind = index, kind
        if call_id:
            start.tool_call_id = call_id
        if name:
            start.tool_name = name
        self.chunks.append(chunk)
        return index

    def _delta(self, index: int, text: str) -> None:
        self.chunks.append((index, text))

    def _close(self, index: int) -> None:
        chunk = stream_pb2.StreamChunk()
        chunk.block_end.index = index  # present even at 0: setting a field marks it set
        self.chunks.append(chunk)


def _pieces(text: str, size: int) -> list[str]:
    """`text` cut into pieces of `size` characters (code points); [] for ""."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def _tool_results(content: Iterable[content_pb2.ContentBlock]) -> list[content_pb2.ToolResultBlock]:
    return [b.tool_result for b in content if b.WhichOneof("block") == "tool_result"]


def _latest_user_text(messages: Sequence[content_pb2.Message]) -> str:
    """The text of the latest user message that has any; "" when none does."""
    for message in reversed(messages):  # from the end, without copying the history
        if message.role == content_pb2.ROLE_USER:
            text = plain_text(message.content)
            if text:
                return text
    return ""


def _text_chars(content: Iterable[content_pb2.ContentBlock]) -> int:
    """Characters of every text-like part of `content`, tool results included."""
    total = 0
    for block in content:
        match block.WhichOneof("block"):
            case "text":
                total += len(block.text.text)
            case "reasoning":
                total += len(block.reasoning.text)
            case "tool_call":
                total += len(block.tool_call.arguments)
            case "tool_result":
                total += _text_chars(block.tool_result.content)
    return total
