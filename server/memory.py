"""Keeping the process small: a frozen start-up heap, and freed memory given back.

Two habits of long-running CPython servers:
- After start-up, `gc.freeze()` moves every object alive then (modules, descriptors,
  the gRPC machinery) out of the collector's generations, so a full collection no
  longer walks them: fewer and shorter pauses under load.
- The youngest generation is collected every `YOUNG_THRESHOLD` allocations, not
  CPython's 700: a turn's objects (events, coroutines, futures) live for a few loop
  passes, and with many agents mid-turn a young collection every 700 allocations
  caught them alive and promoted them. Promoted, they counted toward the next full
  collection, which walks every agent's history (about 0.1-0.3 s at 1,000 agents).
- When agents go away, the memory they used is free for Python but glibc keeps the
  pages; `malloc_trim(0)` returns them to the system, so the resident size follows
  the live agents down. It runs on a worker thread, at most once per `TRIM_INTERVAL`,
  and once right after start-up (importing and building the config's validators frees
  a few MB that would otherwise stay resident for the life of the process).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_INTERVAL = 2.0
"""Seconds between two trims at most."""


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """The C library's `malloc_trim` (glibc), or None; ctypes loads on the first trim."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    return trim


YOUNG_THRESHOLD = 10_000
"""Allocations between two young collections (CPython's default: 700). Higher leaves
fewer of a turn's short-lived objects to be promoted; a young collection walks at most
this many objects, so it stays short (a few ms)."""


def freeze_startup_heap() -> None:
    """Freeze the start-up heap, collect young objects less often, return freed pages."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class Trimmer:
    """Gives freed memory back to the system after agents are disposed (debounced)."""

    def __init__(self) -> None:
        self._last = 0.0
        self._pending: asyncio.TimerHandle | None = None
        self._running: asyncio.Future[None] | None = None

    def soon(self) -> None:
        """Trim within `TRIM_INTERVAL` seconds (a burst of disposals trims once)."""
        if _malloc_trim() is None or self._pending is not None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, self._last + TRIM_INTERVAL - time.monotonic())
        self._pending = loop.call_later(delay, self._trim)

    def _trim(self) -> None:
        self._pending = None
        if self._running is not None and not self._running.done():
            return
        self._last = time.monotonic()
        loop = asyncio.get_running_loop()
        self._running = loop.run_in_executor(None, _call_trim)

    async def close(self) -> None:
        """Cancel a pending trim; wait for a running one."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)


def _call_trim() -> None:
    trim = _malloc_trim()
    assert trim is not None
    trim(0)
