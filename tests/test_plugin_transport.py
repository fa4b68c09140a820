"""The deadline heap both ends of a plugin stream share (`agentloop.plugin.transport`)."""

from __future__ import annotations

import asyncio

from agentloop.plugin.transport import Deadline, Deadlines


class Noted(Deadline):
    """A deadline that notes its name in `fired` when it passes."""

    __slots__ = ("name", "fired")

    def __init__(self, name: str, fired: list[str]) -> None:
        super().__init__()
        self.name = name
        self.fired = fired

    def expire(self) -> None:
        super().expire()
        self.fired.append(self.name)


async def test_deadlines_pass_in_order_and_an_ended_call_is_skipped() -> None:
    fired: list[str] = []
    deadlines = Deadlines()
    late = deadlines.add(Noted("late", fired), 0.04)
    early = deadlines.add(Noted("early", fired), 0.01)  # the timer moves earlier
    ended = deadlines.add(Noted("ended", fired), 0.02)
    ended.ended = True  # the call ended first: its entry is dropped, never expired
    await asyncio.sleep(0.08)
    assert fired == ["early", "late"]
    assert early.expired and late.expired and not ended.expired
    deadlines.close()


async def test_a_closed_heap_expires_nothing() -> None:
    fired: list[str] = []
    deadlines = Deadlines()
    deadlines.add(Noted("dropped", fired), 0.01)
    deadlines.close()
    await asyncio.sleep(0.04)
    assert fired == []
