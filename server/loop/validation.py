"""Checks of request fields that a hostile or careless client controls.

Each refuses with `InvalidArgument` naming the field, before anything is appended or
reached, so that a refused call changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from google.protobuf import duration_pb2, struct_pb2

from agentloop.v1 import agent_pb2, stream_pb2
from agentloop.v1 import content_pb2 as c
from server.kernel.errors import InvalidArgument
from server.kernel.limits import Limits, check_size
from server.models.scripted_options import MAX_CHUNK_DELAY_SECONDS, script_of

USER_BLOCKS = ("text",)
"""The content block kinds a user may send: tool calls, tool results and reasoning come
from models and tools only (a forged tool result would poison the session)."""


def check_message(limits: Limits, text: str, content: Sequence[c.ContentBlock]) -> None:
    """Refuse what a send, steer or inject may not carry, before anything is appended.

    Raises:
        InvalidArgument: a block is empty or not user content (naming `content[i]`), or
            text and content together are over `limits.maxContentBytes`.
    """
    size = len(text.encode())
    for i, block in enumerate(content):
        kind = block.WhichOneof("block")
        if kind is None:
            raise InvalidArgument(f"content[{i}]", "is an empty content block")
        if kind not in USER_BLOCKS:
            raise InvalidArgument(
                f"content[{i}]", f"is a {kind} block; a message may carry only text"
            )
        size += block.ByteSize()
    check_size(limits, "max_content_bytes", "content" if content else "text", size)


def check_agent_options(limits: Limits, options: agent_pb2.AgentOptions) -> None:
    """The sizes of `options`: persona and script, each against its limit."""
    check_size(limits, "max_persona_bytes", "options.persona", len(options.persona.encode()))
    check_context_options(options)
    script = script_of(options)
    field = "options.provider_options.steps"
    check_size(limits, "max_script_steps", field, len(script), "steps")
    calls = sum(len(step.tool_calls) for step in script)
    check_size(limits, "max_script_tool_calls", field, calls, "tool calls")
    for i, step in enumerate(script):
        # A step becomes one assistant message: bounded like any other message.
        check_size(limits, "max_content_bytes", f"{field}[{i}]", step.ByteSize())
        if step.HasField("chunk_delay"):
            where = f"{field}[{i}].chunk_delay"
            duration_seconds(step.chunk_delay, where, MAX_CHUNK_DELAY_SECONDS)
        if step.finish not in stream_pb2.FinishKind.values():
            raise InvalidArgument(f"{field}[{i}].finish", f"{step.finish} is no FinishKind")


def duration_seconds(duration: duration_pb2.Duration, field: str, maximum: float) -> float:
    """The seconds of `duration`, checked to lie in [0, maximum] before any conversion."""
    if not 0 <= duration.seconds <= maximum or not 0 <= duration.nanos < 1_000_000_000:
        raise InvalidArgument(field, f"must be between 0 and {maximum:g} seconds")
    seconds = duration.seconds + duration.nanos / 1e9
    if seconds > maximum:
        raise InvalidArgument(field, f"must be between 0 and {maximum:g} seconds")
    return seconds


def check_finite(struct: struct_pb2.Struct, field: str) -> None:
    """Refuse NaN and infinities anywhere in `struct`: the log is lossless JSON."""
    stack: list[struct_pb2.Value] = list(struct.fields.values())
    while stack:
        value = stack.pop()
        kind = value.WhichOneof("kind")
        if kind == "number_value" and not math.isfinite(value.number_value):
            raise InvalidArgument(field, f"holds {value.number_value}, which JSON cannot carry")
        if kind == "struct_value":
            stack.extend(value.struct_value.fields.values())
        elif kind == "list_value":
            stack.extend(value.list_value.values)


MIN_CONTEXT_WINDOW = 1024
"""The smallest context window an agent may declare (0 declares it unknown)."""

MAX_TOKEN_SETTING = 100_000_000
"""The largest token count an option may hold (no model's window comes near it)."""


def check_context_options(options: agent_pb2.AgentOptions) -> None:
    """The context window and compaction thresholds of `options`, each in range."""
    if options.HasField("context_window_tokens"):
        window = options.context_window_tokens
        if window and not MIN_CONTEXT_WINDOW <= window <= MAX_TOKEN_SETTING:
            raise InvalidArgument(
                "options.context_window_tokens",
                f"must be 0 (unknown) or between {MIN_CONTEXT_WINDOW} and {MAX_TOKEN_SETTING}",
            )
    for name in ("output_reserve_tokens", "keep_recent_tokens"):
        if options.HasField(name) and getattr(options, name) > MAX_TOKEN_SETTING:
            raise InvalidArgument(f"options.{name}", f"must be at most {MAX_TOKEN_SETTING}")
