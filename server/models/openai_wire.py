"""The OpenAI Chat Completions wire format: request bodies out, streamed deltas in.

Pure translation with no I/O, so that each mapping rule reads (and tests) on its own:

- `request_body` builds the JSON of one streaming request from a `ModelRequest`;
- `DeltaTranslator` turns each parsed `chat.completion.chunk` into `StreamChunk`s and
  ends the stream with block ends, the usage and one finish;
- `error_message` reads the message of an error body.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import stream_pb2 as st
from server.kernel.content import plain_text, tool_calls_of
from server.kernel.errors import CodedError
from server.models import ModelRequest

JSON = dict[str, Any]

BAD_CHUNK = "BAD_CHUNK"
STREAM_ERROR = "STREAM_ERROR"

_FINISH_KINDS = {
    "stop": st.FINISH_KIND_STOP,
    "tool_calls": st.FINISH_KIND_STOP,
    "function_call": st.FINISH_KIND_STOP,  # the legacy name of tool_calls
    "length": st.FINISH_KIND_MAX_TOKENS,
}


MAX_TOKENS_FIELDS = ("auto", "max_tokens", "max_completion_tokens")
"""How the output token cap is sent: `auto` picks by model name."""
REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")
"""OpenAI models that refuse `max_tokens` and want `max_completion_tokens`."""


def max_tokens_key(field: str, model: str) -> str:
    """The body key of the output token cap for `model` under the provider's setting."""
    if field != "auto":
        return field
    bare = model.rpartition("/")[2]  # "openai/o3-mini" through a router
    return "max_completion_tokens" if bare.startswith(REASONING_PREFIXES) else "max_tokens"


def request_body(request: ModelRequest, model: str, max_tokens_field: str = "auto") -> JSON:
    """The JSON body of a streaming Chat Completions request.

    Args:
        request: The model call; its header supplies config, system prompt and tools.
        model: The model name to send.
        max_tokens_field: One of `MAX_TOKENS_FIELDS`.

    Returns:
        The body, with `stream` and `stream_options.include_usage` on.
    """
    messages = chat_messages(request.header.system, request.messages)
    return {"model": model, "messages": messages, **body_settings(request, model, max_tokens_field)}


def body_settings(request: ModelRequest, model: str, max_tokens_field: str = "auto") -> JSON:
    """The body's keys after `messages`, in their order: stream, tools, sampling settings."""
    header = request.header
    config = header.config
    body: JSON = {"stream": True, "stream_options": {"include_usage": True}}
    if header.tools:
        body["tools"] = [_tool(schema) for schema in header.tools]
    if config.HasField("temperature"):
        body["temperature"] = config.temperature
    if config.HasField("max_tokens"):
        body[max_tokens_key(max_tokens_field, model)] = config.max_tokens
    if config.stop:
        body["stop"] = list(config.stop)
    return body


NOT_RUN = "Error: this tool call was not run (its turn was cancelled first)."
"""The stand-in answer to a call that never started: Chat Completions requires one."""


def chat_messages(system: str, messages: Sequence[c.Message]) -> list[JSON]:
    """The `messages` array: the system prompt (when set), then the history.

    A user message's tool results become one `tool` message each, ahead of its other
    content (an assistant's tool calls must be answered right after it). A call left
    without a result, because a cancel stopped its batch before it started, gets a
    stand-in error answer: the log keeps no result for it, but the API refuses an
    unanswered call. Reasoning is never sent back: providers that stream it (DeepSeek)
    refuse it as input.
    """
    out: list[JSON] = [system_message(system)] if system else []
    fold = ChatFold()
    for message in messages:
        out.extend(fold.add(message))
    out.extend(fold.answer_the_rest())
    return out


def system_message(system: str) -> JSON:
    """The `system` message of the prompt."""
    return {"role": "system", "content": system}


class ChatFold:
    """`chat_messages` one message at a time: what each message adds to the array.

    Its state is the tool calls asked for and not answered yet (in order): the stand-in
    answers they get depend on what comes after them.
    """

    __slots__ = ("unanswered",)

    def __init__(self, unanswered: Sequence[str] = ()) -> None:
        self.unanswered = list(unanswered)

    def add(self, message: c.Message) -> list[JSON]:
        """The Chat Completions messages `message` adds, stand-in answers first."""
        if message.role == c.ROLE_ASSISTANT:
            out = self.answer_the_rest()
            assistant = _assistant(message)
            out.append(assistant)
            self.unanswered.extend(call["id"] for call in assistant.get("tool_calls", []))
            return out
        out = []
        results = [b.tool_result for b in message.content if b.WhichOneof("block") == "tool_result"]
        for r in results:
            out.append(
                {"role": "tool", "tool_call_id": r.tool_call_id, "content": plain_text(r.content)}
            )
            if r.tool_call_id in self.unanswered:
                self.unanswered.remove(r.tool_call_id)
        text = plain_text(message.content)
        if text or not results:
            out.extend(self.answer_the_rest())
            out.append({"role": "user", "content": text})
        return out

    def answer_the_rest(self) -> list[JSON]:
        """Stand-in answers to the calls still unanswered, which are then answered."""
        out: list[JSON] = [
            {"role": "tool", "tool_call_id": i, "content": NOT_RUN} for i in self.unanswered
        ]
        self.unanswered.clear()
        return out


def _assistant(message: c.Message) -> JSON:
    text = plain_text(message.content)
    calls = [
        {
            "id": call.id,
            "type": "function",
            # An empty argument string is not valid JSON; providers parse it.
            "function": {"name": call.name, "arguments": call.arguments or "{}"},
        }
        for call in tool_calls_of(message.content)
    ]
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": calls}


def _tool(schema: c.ToolSchema) -> JSON:
    parameters = json_format.MessageToDict(schema.input_schema)
    return {
        "type": "function",
        "function": {
            "name": schema.name,
            "description": schema.description,
            "parameters": parameters or {"type": "object", "properties": {}},
        },
    }


@dataclass
class _Call:
    """One streamed tool call; its block opens once its name is known."""

    call_id: str = ""
    name: str = ""
    block: int | None = None
    pending: list[str] = field(default_factory=list)
    """Argument fragments that arrived before the name."""


class DeltaTranslator:
    """Maps the parsed chunks of one Chat Completions stream to `StreamChunk`s.

    Text and reasoning each stream into one block, opened on their first delta; each
    tool-call `index` streams into its own block. Only choice 0 is read.
    """

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._next_block = 0
        self._open: list[int] = []
        self._text: int | None = None
        self._reasoning: int | None = None
        self._calls: dict[int, _Call] = {}
        self._usage: c.Usage | None = None
        self.finish_reason: str | None = None
        """The choice's finish reason, once one arrived."""

    def feed(self, payload: object) -> list[st.StreamChunk]:
        """The chunks for one parsed `data:` payload.

        Raises:
            CodedError: BAD_CHUNK for a payload of the wrong shape; STREAM_ERROR for an
                error object sent in the stream.
        """
        chunk = self._object(payload, "chunk")
        if chunk.get("error"):
            error = chunk["error"]
            detail = error.get("message") if isinstance(error, dict) else error
            raise CodedError(f"{self._provider}: error in stream: {detail}", STREAM_ERROR)
        if chunk.get("usage") is not None:
            self._usage = _usage(self._object(chunk["usage"], "usage"))
        out: list[st.StreamChunk] = []
        for choice in self._list(chunk.get("choices"), "choices"):
            choice = self._object(choice, "choice")
            if choice.get("index", 0) != 0:
                continue
            delta = self._object(choice.get("delta") or {}, "delta")
            # DeepSeek streams `reasoning_content`; vLLM and OpenRouter say `reasoning`.
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self._reasoning = self._extend(
                    out, self._reasoning, st.BLOCK_KIND_REASONING, reasoning
                )
            # A refusal (OpenAI) is what the model says instead of an answer: text too.
            for key in ("content", "refusal"):
                if isinstance(delta.get(key), str) and delta[key]:
                    self._text = self._extend(out, self._text, st.BLOCK_KIND_TEXT, delta[key])
            for position, fragment in enumerate(self._list(delta.get("tool_calls"), "tool_calls")):
                self._tool_fragment(out, position, self._object(fragment, "tool call"))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return out

    def end(self) -> list[st.StreamChunk]:
        """The closing chunks: every open block's end, the usage (if any), the finish."""
        out: list[st.StreamChunk] = []
        for call in self._calls.values():
            if call.block is None:  # never named: surface it, the tool layer reports it
                self._open_call(out, call)
        out.extend(st.StreamChunk(block_end=st.BlockEnd(index=i)) for i in sorted(self._open))
        self._open = []
        if self._usage is not None:
            out.append(st.StreamChunk(usage=self._usage))
        out.append(st.StreamChunk(finish=self._finish()))
        return out

    def _finish(self) -> st.Finish:
        reason = self.finish_reason or "stop"  # [DONE] without a reason: a plain stop
        kind = _FINISH_KINDS.get(reason)
        if kind is not None:
            return st.Finish(kind=kind)
        code = "FINISH_" + re.sub(r"[^A-Z0-9]+", "_", reason.upper()).strip("_")
        return st.Finish(
            kind=st.FINISH_KIND_ERROR,
            message=f"{self._provider}: the model stopped with finish_reason {reason!r}",
            code=code,
        )

    def _extend(
        self, out: list[st.StreamChunk], index: int | None, kind: st.BlockKind.ValueType, text: str
    ) -> int:
        if index is None:
            index = self._start(out, st.BlockStart(kind=kind))
        out.append(st.StreamChunk(block_delta=st.BlockDelta(index=index, text=text)))
        return index

    def _tool_fragment(self, out: list[st.StreamChunk], position: int, fragment: JSON) -> None:
        key = fragment.get("index", position)  # some servers omit the index
        call = self._calls.setdefault(key if isinstance(key, int) else position, _Call())
        function = self._object(fragment.get("function") or {}, "function")
        call.call_id = call.call_id or str(fragment.get("id") or "")
        call.name = call.name or str(function.get("name") or "")
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.pending.append(arguments)
        if call.block is None and call.name:
            self._open_call(out, call)
        elif call.block is not None:
            self._flush(out, call)

    def _open_call(self, out: list[st.StreamChunk], call: _Call) -> None:
        call.call_id = call.call_id or f"call_{uuid.uuid4().hex[:24]}"
        start = st.BlockStart(
            kind=st.BLOCK_KIND_TOOL_CALL, tool_call_id=call.call_id, tool_name=call.name
        )
        call.block = self._start(out, start)
        self._flush(out, call)

    def _flush(self, out: list[st.StreamChunk], call: _Call) -> None:
        assert call.block is not None
        out.extend(
            st.StreamChunk(block_delta=st.BlockDelta(index=call.block, text=piece))
            for piece in call.pending
        )
        call.pending = []

    def _start(self, out: list[st.StreamChunk], start: st.BlockStart) -> int:
        start.index = index = self._next_block
        self._next_block += 1
        self._open.append(index)
        out.append(st.StreamChunk(block_start=start))
        return index

    def _object(self, value: object, what: str) -> JSON:
        if not isinstance(value, dict):
            raise CodedError(
                f"{self._provider}: malformed stream chunk: {what} is not an object", BAD_CHUNK
            )
        return value

    def _list(self, value: object, what: str) -> list[object]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise CodedError(
                f"{self._provider}: malformed stream chunk: {what} is not a list", BAD_CHUNK
            )
        return value


def error_message(text: str) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}`), or ""."""
    try:
        body = json.loads(text)
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    error = body.get("error", body)
    if isinstance(error, dict):
        error = error.get("message") or error.get("detail") or ""
    return error if isinstance(error, str) else ""


CONTEXT_LENGTH_EXCEEDED = "CONTEXT_LENGTH_EXCEEDED"
"""The code of a request refused for passing the model's context window."""

_OVERFLOW_PHRASES = ("maximum context length", "context length", "context_length_exceeded")


def is_overflow(text: str) -> bool:
    """Whether an error body says the request passed the context window.

    OpenAI sets `error.code` to "context_length_exceeded"; vLLM, Ollama and others only
    say it in the message ("This model's maximum context length is N tokens").
    """
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("code") == "context_length_exceeded":
        return True
    lowered = (error_message(text) or text).lower()
    return any(phrase in lowered for phrase in _OVERFLOW_PHRASES)


def _usage(usage: JSON) -> c.Usage:
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = usage.get("prompt_cache_hit_tokens")  # DeepSeek's name for it
    return c.Usage(
        input_tokens=_count(usage.get("prompt_tokens")),
        output_tokens=_count(usage.get("completion_tokens")),
        cached_input_tokens=_count(cached),
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
