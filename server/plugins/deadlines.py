"""The deadlines of a plugin connection's calls in flight: one heap, one timer.

A call's deadline is an entry in the connection's heap rather than a timer of its own
(`asyncio.timeout` schedules one per call and cancels it at once, as nearly every call
ends long before its deadline). One loop timer waits for the earliest deadline still
pending; entries of calls that ended are dropped lazily, when they reach the head.

At its deadline a call that is still writing its request is cancelled (the write may
wait on flow control), and one that waits for its result gets `DeadlineExpired` in
its future.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Any


class DeadlineExpired(Exception):
    """The call's deadline passed before its result arrived."""


class Deadline:
    """One call's deadline: what to expire, and whether the call has ended."""

    __slots__ = ("when", "future", "task", "ended", "expired")

    def __init__(self, when: float, future: asyncio.Future[Any]) -> None:
        self.when = when
        self.future = future
        self.task: asyncio.Task[Any] | None = None
        """Set while the call writes its request: cancelled if the deadline passes then."""
        self.ended = False
        self.expired = False

    def expire(self) -> None:
        """The deadline passed: cancel the write, or fail the wait for the result."""
        self.expired = True
        if self.task is not None:
            self.task.cancel()
        elif not self.future.done():
            self.future.set_exception(DeadlineExpired())


class Deadlines:
    """The deadlines of the calls in flight on one connection."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, seconds: float, future: asyncio.Future[Any]) -> Deadline:
        """Start the deadline of a call whose result `future` will hold; set `ended` after."""
        loop = future.get_loop()
        deadline = Deadline(loop.time() + seconds, future)
        heap = self._heap
        while heap and heap[0][2].ended:  # calls that ended: dropped as they reach the head
            heapq.heappop(heap)
        heapq.heappush(heap, (deadline.when, next(self._order), deadline))
        timer = self._timer
        if timer is None or deadline.when < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline.when, self._fire, loop, deadline.when)
        return deadline

    def _fire(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._timer = None
        heap = self._heap
        now = max(loop.time(), when)  # the loop may run a timer a clock tick early
        while heap and (heap[0][2].ended or heap[0][0] <= now):
            deadline = heapq.heappop(heap)[2]
            if not deadline.ended:
                deadline.expire()
        if heap:
            self._timer = loop.call_at(heap[0][0], self._fire, loop, heap[0][0])

    def close(self) -> None:
        """Forget every deadline (the connection is closed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()
