"""The seam codecs: per seam of the proto's table, how a plugin serves it.

Each family module declares, per seam, one explicit and typed fill (input → payload),
read (result → decision) and apply (decision → the seam's result), wrapped in the
adapter of the seam's mode (`server.plugins.modes`). This table joins them and checks
them against the seam table at import: every seam of the proto has exactly one codec,
of its mode, so a new seam without one fails at start-up, not at its first call.
"""

from __future__ import annotations

from collections.abc import Callable

from agentloop.plugin.seam_table import SPECS
from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.kernel.seams import SeamRegistry
from server.plugins.agent_codecs import AGENT_CODECS
from server.plugins.listeners import RemoteListener
from server.plugins.modes import Approve, Check, Codec, Transform, Watch, Wrap
from server.plugins.observer_codecs import OBSERVER_CODECS
from server.plugins.tool_codecs import TOOL_CODECS

MODES: dict[int, tuple[type, ...]] = {
    hk.SEAM_MODE_WATERFALL: (Transform, Wrap),
    hk.SEAM_MODE_SERIAL: (Check,),
    hk.SEAM_MODE_OBSERVER: (Watch,),
    hk.SEAM_MODE_APPROVER: (Approve,),
}
"""The adapters that serve each mode of the seam table."""


def _codecs(codecs: tuple[Codec, ...]) -> dict[str, Codec]:
    """The codecs by seam path, checked against the seam table."""
    by_path: dict[str, Codec] = {}
    for codec in codecs:
        if codec.key.path in by_path:
            raise RuntimeError(f"seam {codec.key.path}: two codecs")
        by_path[codec.key.path] = codec
    paths = {spec.path for spec in SPECS}
    if extra := sorted(set(by_path) - paths):
        raise RuntimeError(f"codecs of seams the seam table does not have: {extra}")
    for spec in SPECS:
        served = by_path.get(spec.path)
        if served is None:
            raise RuntimeError(f"seam {spec.path}: no codec (server/plugins/*_codecs.py)")
        if not isinstance(served, MODES[spec.mode]):
            raise RuntimeError(f"seam {spec.path}: its codec is not of its mode")
    return {spec.path: by_path[spec.path] for spec in SPECS}


CODECS = _codecs((*AGENT_CODECS, *TOOL_CODECS, *OBSERVER_CODECS))
"""How each seam of the table is served by a plugin, by seam path."""


def register(remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
    """Register a subscription's listener on its seam, as its codec says; the disposer."""
    return CODECS[remote.spec.path].register(remote, seams)
