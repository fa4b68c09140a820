"""What waits to be written to one plugin besides calls: cancels, and notifications.

Notifications wait in a bounded buffer, a share per subscription (`NoticeSlot`); one
that finds no room (or the plugin not READY) is dropped before it is even built, and
the next one queued carries the count. Those still buffered when the stream ends are
dropped and counted the same way, as is one too big to send. A plugin that lists the
`call_batch` capability gets the notifications made within `GATHER_SECONDS` of each
other in one `CallBatch` message, or with the next call if it comes first
(`with_call`); others get them one by one. A cancel goes before them all and cuts a
gathering short. One writer task (`write_loop`) sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable

from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.plugins.calls import Notice, NoticeSlot, PluginStats
from server.plugins.event_notes import EventNote
from server.plugins.wire import BATCH_OVERHEAD, batch_entry, batch_request

GATHER_SECONDS = 0.002
"""How long the first of a run of notifications waits for the others (batching plugins)."""

_COUNTING = frozenset(
    field.name
    for field in hk.HookCall.DESCRIPTOR.oneofs_by_name["payload"].fields
    if field.message_type is not None and "dropped" in field.message_type.fields_by_name
)
"""The notification payloads that carry a `dropped` count (observers'; not the payload
of a seam subscribed `observe_only`)."""


def carried(note: Notice) -> int:
    """The drops a queued notification carries (0 if its payload has no count)."""
    if isinstance(note, EventNote):
        return note.dropped
    payload = note.WhichOneof("payload") or ""
    return int(getattr(note, payload).dropped) if payload in _COUNTING else 0


class NoticeQueue:
    """Cancels and notifications waiting for one plugin's stream, and the drops."""

    def __init__(self, stats: PluginStats, max_message_bytes: int) -> None:
        self._stats = stats
        self._max_message_bytes = max_message_bytes
        self.batches = False
        """Whether the plugin takes `CallBatch`es (it said so in `Describe`)."""
        self._cancels: deque[bytes] = deque()
        self._notes: deque[tuple[Notice, NoticeSlot]] = deque()
        self._dropped = 0
        self._wake_writer = asyncio.Event()
        self._urgent = asyncio.Event()
        """Set by a cancel: the writer stops gathering notifications and sends it."""

    def admit(self, slot: NoticeSlot, ready: bool) -> bool:
        """Room for one more notification of `slot` to a `ready` plugin; else one dropped."""
        if ready and slot.queued < slot.limit:
            return True
        self._dropped += 1
        self._stats.dropped += 1
        return False

    def notify(self, call: Notice, slot: NoticeSlot) -> None:
        """Queue an admitted notification; it carries the drops since the last one."""
        if isinstance(call, EventNote):
            call.dropped, self._dropped = self._dropped, 0
        else:
            payload = call.WhichOneof("payload") or ""
            if payload in _COUNTING:  # else the next observer notification carries the count
                getattr(call, payload).dropped, self._dropped = self._dropped, 0
        slot.queued += 1
        self._notes.append((call, slot))
        self._wake_writer.set()

    def cancel(self, request: bytes) -> None:
        """Queue a `CancelCall` request: sent before any notification, without delay."""
        self._cancels.append(request)
        self._wake_writer.set()
        self._urgent.set()

    def with_call(self, request: bytes) -> bytes:
        """The message that sends `request` (a call).

        To a plugin that takes batches, the notifications waiting go with it, before
        it, in one batch: one message instead of two.
        """
        if self.batches and self._notes:  # the request is also a batch entry
            notes = self._take_notes(self._max_message_bytes - len(request))
            if notes:
                return batch_request([*notes, request])
        return request

    async def write_loop(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        """Send what is not time-critical with `write`: cancels first, then notifications.

        To a plugin that takes batches, notifications wait `GATHER_SECONDS` after the
        first, so that those made meanwhile go with it (or with a call made meanwhile).
        """
        gathered = False
        while True:
            if self._cancels:
                await write(self._cancels.popleft())
                continue
            if self._notes:
                if self.batches and not gathered:
                    gathered = True
                    self._urgent.clear()  # a cancel cuts the wait short
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(GATHER_SECONDS):
                            await self._urgent.wait()
                    continue
                gathered = False
                request = self._next_notes()
                if request is not None:
                    await write(request)
                continue
            gathered = False
            self._wake_writer.clear()
            if not self._cancels and not self._notes:
                await self._wake_writer.wait()

    def _next_notes(self) -> bytes | None:
        """The next message of notifications: one, or a batch of all that fit; None if none."""
        entries = self._take_notes(self._max_message_bytes, 1 << 30 if self.batches else 1)
        if len(entries) > 1:
            return batch_request(entries)
        return entries[0] if entries else None  # alone: the single form, the same bytes

    def _take_notes(self, room: int, most: int = 1 << 30) -> list[bytes]:
        """Batch entries of the oldest queued notifications that fit in `room` bytes.

        A notification too big to send alone is dropped and counted.
        """
        entries: list[bytes] = []
        size = BATCH_OVERHEAD
        notes = self._notes
        while notes and len(entries) < most:
            note, slot = notes[0]
            if isinstance(note, EventNote):
                entry = note.entry()
            else:
                entry = batch_entry(note.SerializeToString())
            if len(entry) > self._max_message_bytes:
                notes.popleft()
                slot.queued -= 1
                self._dropped += carried(note) + 1  # too big to send: dropped, counted
                self._stats.dropped += 1
                self._stats.oversized += 1
                continue
            if entries and size + len(entry) > room:
                break  # the rest goes in the next message
            notes.popleft()
            slot.queued -= 1
            entries.append(entry)
            size += len(entry)
        return entries

    def clear(self) -> None:
        """The stream ended: its cancels are forgotten, its notifications dropped.

        The notifications still buffered are counted, and carried by the next one.
        """
        self._cancels.clear()
        for note, slot in self._notes:
            slot.queued -= 1
            self._dropped += carried(note) + 1
            self._stats.dropped += 1
        self._notes.clear()
