"""`AgentOptions` from keyword arguments, so that creating an agent needs no proto import."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict, Unpack

from google.protobuf import any_pb2
from google.protobuf.message import Message

from agentloop.v1 import agent_pb2


class OptionFields(TypedDict, total=False):
    """The fields of `AgentOptions` as keyword arguments of `create` and `resume`."""

    provider: str
    """A provider name (`scripted`, or one under `providers` in the server's config)."""
    model: str
    """The provider's model name."""
    tools: Sequence[str]
    """The tools the agent may call (built-in ones, or tools plugins bring)."""
    persona: str
    """The system prompt's persona (`{{provider}}`, `{{model}}`, `{{cwd}}` expand)."""
    max_parallel_tool_calls: int
    """Parallel-safe tool calls run at once in a step (1: serial)."""
    approval_required_tools: Sequence[str]
    """Tools whose every call waits for a person's approval."""
    approval_timeout: float
    """Seconds a tool call waits for approval before it is refused."""
    provider_options: Message
    """The provider's own options message (such as `ScriptedOptions`), or an `Any`."""


def agent_options(
    options: agent_pb2.AgentOptions | None = None, **fields: Unpack[OptionFields]
) -> agent_pb2.AgentOptions | None:
    """`options` (or new options) with every field given set on it; None when neither."""
    if not fields:
        return options
    provider = fields.get("provider", "")
    model = fields.get("model", "")
    tools = fields.get("tools", ())
    persona = fields.get("persona", "")
    max_parallel_tool_calls = fields.get("max_parallel_tool_calls")
    approval_required_tools = fields.get("approval_required_tools", ())
    approval_timeout = fields.get("approval_timeout")
    provider_options = fields.get("provider_options")
    merged = agent_pb2.AgentOptions()
    if options is not None:
        merged.CopyFrom(options)
    if provider:
        merged.provider = provider
    if model:
        merged.model = model
    if tools:
        merged.tools[:] = list(tools)
    if persona:
        merged.persona = persona
    if max_parallel_tool_calls is not None:
        merged.max_parallel_tool_calls = max_parallel_tool_calls
    if approval_required_tools:
        merged.approval_required_tools[:] = list(approval_required_tools)
    if approval_timeout is not None:
        merged.approval_timeout.FromNanoseconds(int(approval_timeout * 1e9))
    if provider_options is not None:
        if isinstance(provider_options, any_pb2.Any):
            merged.provider_options.CopyFrom(provider_options)
        else:
            merged.provider_options.Pack(provider_options)
    return merged
