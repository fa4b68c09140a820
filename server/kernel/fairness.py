"""Cooperative fairness: long synchronous stretches of one turn give the event loop a turn.

A scripted model (or any provider whose stream never waits) can hand the loop 100,000
chunks without a single suspension; every other agent, stream and health check would
wait for all of them. Calling `yield_if_due` in such loops caps a stretch at `SLICE`.
"""

from __future__ import annotations

import asyncio
import time

SLICE = 0.02
"""Seconds of work after which the next `yield_if_due` lets other tasks run."""

_last = time.monotonic()


async def yield_if_due() -> None:
    """Let the event loop run other tasks if `SLICE` passed since this last did."""
    global _last
    now = time.monotonic()
    if now - _last >= SLICE:
        await asyncio.sleep(0)
        _last = time.monotonic()


def due() -> bool:
    """Whether `yield_if_due` would yield now: a check without a coroutine, for hot loops."""
    return time.monotonic() - _last >= SLICE
