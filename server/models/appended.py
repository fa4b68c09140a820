"""An encoding of a history kept from one model request to the next, extended by what is new.

Each request of a step carries the whole history, and a provider that translated or
serialized all of it per request would spend O(history) CPU on the event loop at every
step (`bench.provider_request_bench`: at 12,000 messages, about 150 ms for the OpenAI
body and 20-40 ms for a plugin's call, on the one event loop of every agent). A
provider keeps, per agent, the encoded form of the history messages it has sent, and
encodes only those appended since. `Appended` decides what is new.

Why an encoding kept this way is never stale:

- A request's messages are a `MessageView` (`server.kernel.history`): a prefix, then the
  first `length` messages of the session's history list. The prefix (the header's
  message prefix, copied into each request's header) is encoded afresh per request;
  only the list's messages are kept.
- That list is only appended to: `SessionLog` never edits, removes or reorders an
  entry; a replacement (a compaction) builds a new list, and a resumed or another
  session has its own. While the list is the same object and the view at least as
  long as what was encoded, its first `count` messages are those encoded before. The
  tracker holds the list, so the object cannot be freed and its id reused by another.
- A history message is never mutated once appended: `SessionLog` projects each one from
  its event into a new `Message` that it alone holds; what listeners return (a rewritten
  `agent/step-result`, a prefix) is copied into an event or a header, never shared
  with the list, and a request's messages are not to be mutated (`ModelRequest`).
- Whatever else a message's encoding depends on (for OpenAI, the tool calls the prefix
  left unanswered) is the `key`: another key starts over.

A request with a long backlog (the first of an agent after a resume, a compaction or a
server restart: the whole history) encodes it in slices (`in_slices`): at most
`SLICE_MESSAGES` messages or about `SLICE_BYTES` bytes each, the event loop running
other tasks between two. Each slice is kept as soon as it is encoded, in one synchronous
stretch (its bytes and the count that claims them together), so a request cancelled
between two slices leaves a shorter encoding that is still exact, and the next request
goes on from it.

Memory: an encoding holds the bytes of its agent's history (about the size of the
messages themselves, which the session holds already) and a reference to the list; it
is replaced at the agent's next request after a compaction, and dropped when the agent
is disposed (`ModelRegistry.release`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence

from agentloop.v1 import content_pb2 as c
from server.kernel.abort import AbortSignal
from server.kernel.history import MessageView

SLICE_MESSAGES = 128
"""The most history messages encoded in one stretch of the event loop (`in_slices`)."""
SLICE_BYTES = 128 * 1024
"""The bytes (serialized messages) after which a slice ends, if it has not ended before."""


class Appended:
    """Which messages of a history list an encoding holds: the first `count` of `items`."""

    __slots__ = ("_items", "_count", "_key")

    def __init__(self) -> None:
        self._items: list[c.Message] | None = None
        self._count = 0
        self._key: Hashable = None

    def advance(
        self, items: list[c.Message], length: int, key: Hashable = None
    ) -> tuple[bool, Sequence[c.Message]]:
        """Take the first `length` messages of `items` as encoded from now on.

        Returns:
            Whether the encoding must start over (another list, a shorter view, another
            key), and the messages to encode: those beyond the encoded ones, or all.
        """
        start = self.kept(items, length, key)
        restart = start == 0
        self._items, self._count, self._key = items, length, key
        return restart, items[start:length]

    @property
    def count(self) -> int:
        """How many messages of its list the encoding holds."""
        return self._count

    def kept(self, items: list[c.Message], length: int, key: Hashable = None) -> int:
        """How many of the first messages of `items` the encoding holds for such a request.

        0 when `advance` would start over: another list, a shorter view, another key.
        """
        if items is not self._items or length < self._count or key != self._key:
            return 0
        return self._count


async def in_slices(
    appended: Appended,
    items: list[c.Message],
    length: int,
    key: Hashable,
    extend: Callable[[int], int],
    signal: AbortSignal,
) -> int:
    """Encode the first `length` messages of `items` a slice at a time, yielding between.

    `extend(start)` encodes the messages from `start` (at most one slice's worth, at
    least one message), keeps them (advancing `appended`) and returns where it stopped.
    Between two slices the event loop runs other tasks; a cancel of the task (or an
    abort of `signal`) then stops here, what was kept being exact. Should the kept
    encoding be another's when this one resumes (a request of the same agent in
    between), the slicing stops: the caller encodes the rest at once, as it would
    without slices (two requests taking turns never undo each other's work forever).

    Returns:
        How many times it let the loop run other tasks.
    """
    yields = 0
    done = appended.kept(items, length, key)
    while done < length:
        done = extend(done)
        if done >= length:
            break
        await asyncio.sleep(0)
        yields += 1
        signal.raise_if_aborted()
        if appended.kept(items, length, key) != done:
            break  # another request's encoding meanwhile: the caller goes on at once
    return yields


def slice_end(items: list[c.Message], start: int, length: int) -> int:
    """Where a slice of `items[start:length]` ends: `SLICE_MESSAGES` or `SLICE_BYTES`."""
    end = min(length, start + SLICE_MESSAGES)
    size = 0
    for i in range(start, end):
        size += items[i].ByteSize()
        if size >= SLICE_BYTES:
            return i + 1
    return end


def split(messages: Sequence[c.Message]) -> tuple[Sequence[c.Message], list[c.Message], int]:
    """A request's messages as (prefix, growing list, length): see `MessageView.split`.

    Messages that are not a view (a test's list) are all prefix: nothing is kept.
    """
    if isinstance(messages, MessageView):
        return messages.split()
    return messages, [], 0
