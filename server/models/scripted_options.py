"""The scripted provider's own options: `ScriptedOptions` in `AgentOptions.provider_options`.

The script is no field of the common agent options: it travels as a
`google.protobuf.Any`, so only the provider that reads it knows its shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from google.protobuf import any_pb2

from agentloop.v1 import agent_pb2, scripted_pb2

OPTIONS_TYPE = scripted_pb2.ScriptedOptions.DESCRIPTOR.full_name
"""The type of `provider_options` the scripted provider takes."""

MAX_CHUNK_DELAY_SECONDS = 60
"""The longest pause a script may put between two chunks."""


def script_options(steps: Iterable[scripted_pb2.ScriptedStep]) -> any_pb2.Any:
    """`provider_options` carrying a script: one step per model call."""
    packed = any_pb2.Any()
    packed.Pack(scripted_pb2.ScriptedOptions(steps=list(steps)))
    return packed


def script_of(options: agent_pb2.AgentOptions) -> Sequence[scripted_pb2.ScriptedStep]:
    """The script in `options` (empty without scripted provider options)."""
    if not options.provider_options.Is(scripted_pb2.ScriptedOptions.DESCRIPTOR):
        return ()
    unpacked = scripted_pb2.ScriptedOptions()
    options.provider_options.Unpack(unpacked)
    return unpacked.steps


def options_type(options: agent_pb2.AgentOptions) -> str:
    """The full name of the message in `provider_options`; "" when unset."""
    if not options.HasField("provider_options"):
        return ""
    return options.provider_options.TypeName()
