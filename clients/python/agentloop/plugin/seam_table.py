"""The seam table, read from the plugin proto: each `Seam` value's `seam` option.

The proto declares every seam once (`(agentloop.plugin.v1.seam) = {path, mode, method,
payload}` on its `Seam` value); the server's remote listeners, this SDK's dispatch and
the plugin checker all read it from here, so no copy of the table is kept by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message as ProtoMessage

from agentloop.plugin.v1 import hook_service_pb2 as hs


@dataclass(frozen=True)
class SeamSpec:
    """How one seam travels."""

    seam: hs.Seam.ValueType
    path: str
    """The server's name of the seam the subscription listens on."""
    mode: hs.SeamMode.ValueType
    """Waterfall, serial checkpoint, observer or approver."""
    method: str
    """The plugin helpers' registration method (`Plugin.prompt_submit`, ...)."""
    payload: str
    """The field of `HookCall.payload`, and of `HookResult.outcome` when answered."""
    decision: type[ProtoMessage] | None
    """The decision type (the `HookResult` field's message); None for an observer."""


def _read() -> tuple[SeamSpec, ...]:
    specs = []
    result = hs.HookResult()
    for value in hs.Seam.DESCRIPTOR.values:
        options = value.GetOptions()
        if not options.HasExtension(hs.seam):
            continue
        option = options.Extensions[hs.seam]
        observer = option.mode == hs.SEAM_MODE_OBSERVER
        decision = None if observer else type(getattr(result, option.payload))
        specs.append(
            SeamSpec(
                hs.Seam.ValueType(value.number), option.path, option.mode, option.method,
                option.payload, decision,
            )
        )  # fmt: skip
    return tuple(specs)


SPECS = _read()
"""Every seam a plugin can subscribe to, in `Seam` number order."""
BY_SEAM = {spec.seam: spec for spec in SPECS}
BY_PAYLOAD = {spec.payload: spec for spec in SPECS}
BY_PATH = {spec.path: spec for spec in SPECS}
