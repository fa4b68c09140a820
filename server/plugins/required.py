"""Required plugins: nothing runs unguarded while a configured guard is not READY.

A plugin listed in the config is required unless its entry says `required: false`
(or overrides its failure policy to fail_open). Before its first `Describe` the server
cannot know which seams it serves, so it assumes all of them, served FAIL_CLOSED: a
guard listener on every seam of a turn ends the turn `error` (code PLUGIN_NOT_READY),
naming the plugin and the seam. Once the plugin is registered its own listeners take
over, and while its stream is not READY its FAIL_CLOSED calls fail as any call does.

Readiness (the gRPC health service `agentloop.readiness`) is SERVING only while every
required plugin is registered and READY.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import NoReturn

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from server.kernel import seams as S
from server.kernel.errors import TurnFatal
from server.kernel.seams import SeamKey, SeamRegistry

READINESS_SERVICE = "agentloop.readiness"
"""The health service name that reports whether every required plugin is READY."""

Refusal = Callable[..., Awaitable[NoReturn]]
"""A listener that only ever raises: it fits every seam."""

GUARDED: tuple[S.Seam[Refusal], ...] = (
    S.PROMPT_SUBMIT, S.PRE_STEP, S.REQUEST, S.STEP_RESULT, S.TURN_CONTINUATION, S.TURN_STOP,
    S.TOOLS_PRE_EXECUTE, S.TOOLS_POST_EXECUTE,
)  # fmt: skip
"""The seams of a turn a not-yet-described plugin is assumed to serve."""


@dataclass
class Expected:
    """A required config plugin that has not registered yet."""

    name: str
    """The config's `name`, else the address: how ListPlugins shows it until Describe."""
    address: str
    last_error: str = ""
    disposers: list[Callable[[], None]] = field(default_factory=list)

    def listed(self) -> reg.Plugin:
        """Its ListPlugins entry: CONNECTING, required."""
        return reg.Plugin(
            name=self.name,
            address=self.address,
            state=reg.PLUGIN_STATE_CONNECTING,
            last_error=self.last_error,
            required=True,
        )


def guard(seams: SeamRegistry, expected: Expected) -> None:
    """Put a fail-closed stand-in for `expected` first on every guarded seam."""
    for seam in GUARDED:
        expected.disposers.append(
            seams.on(seam, _refusal(expected, seam), prepend=True, name=expected.name)
        )


def release(expected: Expected) -> None:
    """Remove the stand-in (the plugin registered, or the server stops)."""
    for dispose in expected.disposers:
        dispose()
    expected.disposers.clear()


def _refusal(expected: Expected, seam: SeamKey) -> Refusal:
    """A listener that only ever raises: it fits every seam."""

    async def refuse(*args: object) -> NoReturn:
        why = f": {expected.last_error}" if expected.last_error else ""
        raise TurnFatal(
            f'plugin "{expected.name}" failed at {seam}: not ready: a required plugin has'
            f" not connected yet{why}",
            "PLUGIN_NOT_READY",
        )

    return refuse


def all_ready(states: Iterable[reg.PluginState.ValueType], pending: int) -> bool:
    """Whether readiness holds: nothing pending, every required plugin READY."""
    return pending == 0 and all(state == reg.PLUGIN_STATE_READY for state in states)
