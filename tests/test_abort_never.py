"""The never-firing signal is shared by every owner-less call: it must hold no state."""

from __future__ import annotations

import asyncio

import pytest

from server.kernel.abort import NEVER, AbortController
from server.kernel.errors import Aborted


async def test_never_keeps_no_callbacks_and_races_in_the_callers_task() -> None:
    removers = [NEVER.on_abort(lambda reason: None) for _ in range(1000)]
    assert NEVER._callbacks == [] and not NEVER.aborted
    for remove in removers:
        remove()
    caller = asyncio.current_task()

    async def work() -> asyncio.Task[object] | None:
        return asyncio.current_task()

    assert await NEVER.race(work()) is caller  # no task per await


async def test_never_waits_until_its_caller_is_cancelled() -> None:
    waiter = asyncio.ensure_future(NEVER.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_a_real_signal_still_aborts_its_race() -> None:
    controller = AbortController()
    race = asyncio.ensure_future(controller.signal.race(asyncio.sleep(10)))
    await asyncio.sleep(0)
    controller.abort("stop")
    with pytest.raises(Aborted, match="stop"):
        await race
