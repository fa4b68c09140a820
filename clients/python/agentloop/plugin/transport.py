"""What both ends of a plugin's `Handle` stream share: message limit, framing, deadlines.

The server (its plugin client) and this package's plugin helper import them from here,
so each is written once; the server frames its other byte-built messages (stream
responses, SQLite rows of events) with the same primitives. It imports nothing but
the standard library.

Framing: where bytes already held (events serialized once, plugin calls encoded once)
are framed into a message instead of being copied into one and serialized again.

Deadlines: a call's deadline is an entry in one heap rather than a timer of its own
(`asyncio.timeout` schedules one per call and cancels it at once, as nearly every call
ends long before its deadline). One loop timer waits for the earliest deadline still
pending; entries of calls that ended are dropped lazily, when they reach the head.
What a deadline does when it passes is its subclass's (`Deadline.expire`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import TypeVar

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest message sent to or accepted from a plugin by default: the server's
`pluginMaxMessageBytes`, and what a plugin must accept and may send."""

# -- framing -----------------------------------------------------------------------------

LENGTH_DELIMITED = 2
"""The wire type of bytes, strings and messages."""

_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def varint(value: int) -> bytes:
    """`value` (≥ 0) as a base-128 varint."""
    if value < 0x80:  # most lengths of events and calls: a table look-up
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_key(number: int) -> bytes:
    """The key of a length-delimited field `number`."""
    return varint((number << 3) | LENGTH_DELIMITED)


def framed(key: bytes, payload: bytes) -> bytes:
    """A length-delimited field: key, length, payload."""
    return b"".join((key, varint(len(payload)), payload))


# -- deadlines ---------------------------------------------------------------------------


class DeadlineExpired(Exception):
    """The call's deadline passed before its result arrived."""


class Deadline:
    """One call's deadline; its owner sets `ended` when the call ends before it."""

    __slots__ = ("when", "ended", "expired")

    def __init__(self) -> None:
        self.when = 0.0
        self.ended = False
        self.expired = False

    def expire(self) -> None:
        """The deadline passed (the call had not ended): what the call does then."""
        self.expired = True


D = TypeVar("D", bound=Deadline)


class Deadlines:
    """The deadlines of the calls in flight on one stream."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, deadline: D, seconds: float) -> D:
        """Start `deadline`, `seconds` from now; its owner sets `ended` when the call ends."""
        loop = asyncio.get_running_loop()
        deadline.when = when = loop.time() + seconds
        heap = self._heap
        while heap and heap[0][2].ended:  # calls that ended: dropped as they reach the head
            heapq.heappop(heap)
        entry: tuple[float, int, Deadline] = (when, next(self._order), deadline)
        heapq.heappush(heap, entry)
        timer = self._timer
        if timer is None or when < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(when, self._fire, loop, when)
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
        """Forget every deadline (the stream is closed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()
