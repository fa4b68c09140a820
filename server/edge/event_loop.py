"""The event loop the server runs on: uvloop by default, asyncio's own on request.

The loop's own work is a large share of a turn over gRPC: grpc.aio completes every
operation on a poller thread and hands it to the loop (a wake-up, a callback, a task
step), about 15 loop passes a turn for one agent against 6 in process. uvloop runs
those passes in C (libuv) where asyncio's run them in Python: measured on one agent's
turn over gRPC (SQLite), the server's instructions fell from 3.51 M to 3.17 M
(`python -m bench.grpc_instructions`), its CPU per turn by about 10 % (medians of 10
interleaved runs). `eventLoop: asyncio` runs on asyncio's loop (where uvloop is not
installed, such as Windows, it is the fallback, with a warning).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


def run(main: Coroutine[Any, Any, int], choice: str) -> int:
    """Run `main` to its end on a new loop of kind `choice`, as `asyncio.run` does."""
    with asyncio.Runner(loop_factory=factory(choice)) as runner:
        return runner.run(main)


def factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes a loop of kind `choice`; None: asyncio's default."""
    if choice != "uvloop":
        return None
    try:
        uvloop: Any = importlib.import_module("uvloop")
    except ImportError:
        log.warning("eventLoop: uvloop is not installed here; running on asyncio's loop")
        return None
    new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return new_loop
