"""gRPC's polled endpoints for plugin streams: less CPU per message, set before grpc loads.

A plugin stream is a chain of small messages, each waiting for the one before, so what
one message costs in gRPC's I/O layer is the floor of every plugin call. gRPC 1.85 (the
pinned version) reads and writes connections through its EventEngine endpoints by
default: their I/O completes on an EventEngine thread and is handed on to the thread
that polls the completion queue. Its polled endpoints (the `-event_engine_client` and
`-event_engine_listener` experiments) are read and written by that polling thread
itself: one thread hop less per message. Measured on a bidi ping-pong here
(`python -m bench.pingpong_bench`): about a sixth less CPU per round trip on each side,
and a shorter round trip.

gRPC reads `GRPC_EXPERIMENTS` once, as it loads: `prefer_polled_endpoints` must run
before the process's first `import grpc`, and does nothing after it. The server asks
for `CLIENT` (the channels it opens to plugins; its own listener is left as it is),
the plugin helper for `LISTENER` (the connections it accepts). A process whose
`GRPC_EXPERIMENTS` names anything else, or is set empty, keeps its own choice; one
that inherited only these flags (a plugin started by a process that set them) gets
its own added.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "GRPC_EXPERIMENTS"
CLIENT = "-event_engine_client"
"""Polled endpoints for the connections this process opens (its channels)."""
LISTENER = "-event_engine_listener"
"""Polled endpoints for the connections this process accepts (its servers)."""
OURS = frozenset((CLIENT, LISTENER))


def prefer_polled_endpoints(flag: str, environ: dict[str, str] | None = None) -> bool:
    """Add `flag` to `GRPC_EXPERIMENTS` if gRPC has not loaded and it is ours to set.

    Returns whether the variable now holds `flag` (set here or before).
    """
    env: dict[str, str] | os._Environ[str] = os.environ if environ is None else environ
    current = env.get(VARIABLE)
    flags = [part.strip() for part in (current or "").split(",") if part.strip()]
    if current is not None and (not flags or not set(flags) <= OURS):
        return False  # the operator's choice
    if flag in flags:
        return True
    if "grpc" in sys.modules:
        return False  # too late: gRPC read the experiments as it loaded
    env[VARIABLE] = ",".join([*flags, flag])
    return True
