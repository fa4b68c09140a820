"""Model providers served by a plugin: the chunk helpers, and the streaming of one call.

A model handler receives the `HookCall` (`call.model_stream`: `provider`, `header` with
the config, system prompt and tools, and `messages`) and either

- is an async generator yielding `StreamChunk`s: block starts, deltas and ends (built
  with `text_chunks`, `tool_call_chunks`), then `usage_chunk(...)`, then a
  `finish_chunk(...)` (one is appended when the generator ends without it; a finish
  ends the stream and closes the generator); or
- is an async function returning a `str` (one text block, then a finish `STOP`), a
  sequence of `StreamChunk`s (sent as they are, a finish appended when missing), or
  `None` (an empty answer).

Every chunk is sent as soon as it is produced. A handler that raises, or yields
something that is not a chunk, answers `HookResult.error` (the model call fails with
its text). `call.timeout` bounds the silence between two chunks: past it the call is
cancelled and nothing more is sent, since the server has stopped waiting.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from agentloop.plugin.calls import duration, error_text, failure
from agentloop.plugin.decisions import text_of
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import stream_pb2 as st

log = logging.getLogger("agentloop.plugin")

STOP = st.FINISH_KIND_STOP
"""The model stopped normally (with or without tool calls)."""
MAX_TOKENS = st.FINISH_KIND_MAX_TOKENS
"""The model hit its output-token limit; the step's tool calls are dropped."""
ERROR = st.FINISH_KIND_ERROR
"""The provider failed; the step fails with the finish's message and code."""

TEXT = st.BLOCK_KIND_TEXT
"""A text block."""
REASONING = st.BLOCK_KIND_REASONING
"""A reasoning block."""

ModelReturn: TypeAlias = str | Iterable[st.StreamChunk] | None
"""What a plain (non-generator) model handler returns."""

ModelHandler: TypeAlias = Callable[
    [hs.HookCall], AsyncIterator[st.StreamChunk] | Awaitable[ModelReturn]
]
"""A model handler: an async generator of chunks, or an async function (see above)."""


def text_chunks(
    text: str, *, index: int = 0, chunk_size: int = 8, kind: st.BlockKind.ValueType = TEXT
) -> list[st.StreamChunk]:
    """A block of `kind` at `index`: its start, `text` in deltas of `chunk_size`, its end.

    Empty text gives no chunks at all.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    if not text:
        return []
    start = st.StreamChunk(block_start=st.BlockStart(index=index, kind=kind))
    deltas = [
        st.StreamChunk(block_delta=st.BlockDelta(index=index, text=text[i : i + chunk_size]))
        for i in range(0, len(text), chunk_size)
    ]
    return [start, *deltas, st.StreamChunk(block_end=st.BlockEnd(index=index))]


def tool_call_chunks(
    call_id: str, name: str, arguments: str | Any = "", index: int = 0
) -> list[st.StreamChunk]:
    """A tool-call block at `index`; `arguments` is JSON text, or a value sent as JSON."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    start = st.BlockStart(
        index=index, kind=st.BLOCK_KIND_TOOL_CALL, tool_call_id=call_id, tool_name=name
    )
    chunks = [st.StreamChunk(block_start=start)]
    if arguments:
        chunks.append(st.StreamChunk(block_delta=st.BlockDelta(index=index, text=arguments)))
    chunks.append(st.StreamChunk(block_end=st.BlockEnd(index=index)))
    return chunks


def usage_chunk(
    input_tokens: int = 0, output_tokens: int = 0, cached_input_tokens: int = 0
) -> st.StreamChunk:
    """A usage chunk."""
    usage = c.Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached_input_tokens,
    )
    return st.StreamChunk(usage=usage)


def finish_chunk(
    kind: st.FinishKind.ValueType = STOP, message: str = "", code: str = ""
) -> st.StreamChunk:
    """The finish chunk: `STOP`, `MAX_TOKENS`, or `ERROR` with a message and code."""
    return st.StreamChunk(finish=st.Finish(kind=kind, message=message, code=code))


def last_user_text(messages: Iterable[c.Message]) -> str:
    """The text of the latest user message that has text; "" when none has."""
    for message in reversed(list(messages)):
        if message.role == c.ROLE_USER and (text := text_of(message.content)):
            return text
    return ""


def model_definition(
    provider: str, default_model: str, timeout: float | None
) -> hs.ModelProviderDefinition:
    """A model provider's definition; no timeout means the server's (60 s of silence)."""
    definition = hs.ModelProviderDefinition(provider=provider, default_model=default_model)
    if timeout is not None:
        definition.timeout.CopyFrom(duration(timeout))
    return definition


@dataclass
class ModelProvider:
    """One registered model provider."""

    definition: hs.ModelProviderDefinition
    handler: ModelHandler = field(repr=False)

    @property
    def name(self) -> str:
        """The provider name."""
        return self.definition.provider

    async def responses(self, call: hs.HookCall) -> AsyncGenerator[hs.HandleResponse]:
        """Run the handler: one `HandleResponse.chunk` per chunk, or a final error result.

        Ends after the finish chunk; a generator that ended without one gets a finish
        `STOP`. Nothing more is sent once the silence deadline (`call.timeout`) passed.
        """
        limit = call.timeout.ToNanoseconds() / 1e9 if call.HasField("timeout") else 0.0
        chunks = _chunks(self.handler, call)
        try:
            while True:
                deadline = asyncio.timeout(limit if limit > 0 else None)
                try:
                    async with deadline:
                        chunk = await anext(chunks, None)
                except Exception as exc:
                    if deadline.expired():  # the server stopped waiting (and cancels the call)
                        log.warning("plugin model %s: call %s went silent", self.name, call.call_id)
                        return
                    log.warning("plugin model %s: call %s failed: %s", self.name, call.call_id, exc)
                    error = failure(call.call_id, error_text(exc))
                    yield hs.HandleResponse(result=error)
                    return
                if chunk is None:
                    chunk = finish_chunk()
                yield hs.HandleResponse(chunk=hs.ModelChunk(call_id=call.call_id, chunk=chunk))
                if chunk.HasField("finish"):
                    return
        finally:
            await chunks.aclose()


async def _chunks(handler: ModelHandler, call: hs.HookCall) -> AsyncGenerator[st.StreamChunk]:
    """The handler's chunks, checked: each must be a `StreamChunk` with its chunk set."""
    items = await _items(handler(call))
    try:
        async for item in items:
            if not isinstance(item, st.StreamChunk) or item.WhichOneof("chunk") is None:
                raise TypeError(f"the model handler produced {item!r}, not a StreamChunk")
            yield item
    finally:
        if isinstance(items, AsyncGenerator):
            await items.aclose()


async def _items(
    produced: AsyncIterator[st.StreamChunk] | Awaitable[ModelReturn],
) -> AsyncIterator[Any]:
    """What a handler produced, as an iterator: a generator's items, or a return value's."""
    if isinstance(produced, AsyncIterator):
        return produced
    return _returned(await produced)


async def _returned(value: Any) -> AsyncIterator[Any]:
    """A plain handler's return value as chunks."""
    if isinstance(value, str):
        for chunk in text_chunks(value):
            yield chunk
        yield finish_chunk()
    elif value is not None:
        if not isinstance(value, Iterable):
            raise TypeError(f"the model handler returned {value!r}, not text or chunks")
        for item in value:
            yield item
