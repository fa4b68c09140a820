"""What waits to be written to one plugin besides calls: cancels, and notifications.

Notifications wait in a bounded buffer, a share per subscription (`NoticeSlot`); one
that finds no room (or the plugin not READY) is dropped before it is even built, and
the next one queued carries the count. Those still buffered when the stream ends are
dropped and counted the same way, as is one too big to send. Each is encoded when it
is queued (a session event straight from its parts, `event_notes`), so the queue holds
bytes and the writer only joins them. A plugin that lists the
`call_batch` capability gets the notifications made within `GATHER_SECONDS` of each
other in one `CallBatch` message, or with the next call if it comes first
(`with_call`); others get them one by one. A cancel goes before them all and cuts a
gathering short. One writer task (`write_loop`) sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from itertools import chain, repeat
from operator import itemgetter

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import session_event_pb2 as ev
from server.plugins.calls import NoticeSlot, PluginStats
from server.plugins.event_notes import event_entries, event_entry
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


_ENTRIES_OF = itemgetter(0)
_SLOT_OF = itemgetter(1)
"""A queued run's entries and slot (read in C, not one bytecode loop each)."""


class NoticeQueue:
    """Cancels and notifications waiting for one plugin's stream, and the drops."""

    def __init__(self, stats: PluginStats, max_message_bytes: int) -> None:
        self._stats = stats
        self._max_message_bytes = max_message_bytes
        self.batches = False
        """Whether the plugin takes `CallBatch`es (it said so in `Describe`)."""
        self.ready = False
        """Whether the plugin is READY: its connection sets it on every change. Kept here,
        so that `admit`, asked for every event an observer sees, is one call."""
        self._cancels: deque[bytes] = deque()
        self._notes: deque[tuple[list[bytes], NoticeSlot, int]] = deque()
        """Queued notifications, in runs: their batch entries, their slot, the drops the
        first carries. A run queued together stays one item (no object per notification
        for the collector to count and walk)."""
        self._count = 0
        """The queued entries."""
        self._bytes = 0
        """The size of the queued entries together."""
        self._dropped = 0
        self._wake_writer = asyncio.Event()
        self._writer_waits = False
        """The writer waits for `_wake_writer`: only then does a notification set it (one
        `Event.set` per run of notifications, not one per notification)."""
        self._urgent = asyncio.Event()
        """Set by a cancel: the writer stops gathering notifications and sends it."""

    def admit(self, slot: NoticeSlot) -> bool:
        """Room for one more notification of `slot` to a READY plugin; else one dropped."""
        if self.ready and slot.queued < slot.limit:
            return True
        self._dropped += 1
        self._stats.dropped += 1
        return False

    def notify(self, call: hk.HookCall, slot: NoticeSlot) -> None:
        """Queue an admitted notification; it carries the drops since the last one."""
        carries = 0
        payload = call.WhichOneof("payload") or ""
        if payload in _COUNTING:  # else the next observer notification carries the count
            carries, self._dropped = self._dropped, 0
            getattr(call, payload).dropped = carries
        self._queue(batch_entry(call.SerializeToString()), slot, carries)

    def offer_event(self, head: bytes, event: ev.SessionEvent, slot: NoticeSlot) -> None:
        """`admit` and queue a session-event notification (`event_notes.event_entry`).

        One call for both, `_queue` inline: an observer offers every event it sees.
        """
        if not self.ready or slot.queued >= slot.limit:
            self._dropped += 1
            self._stats.dropped += 1
            return
        carries, self._dropped = self._dropped, 0
        self._queue(event_entry(head, event, carries), slot, carries)

    def offer_events(
        self, head: bytes, events: Sequence[ev.SessionEvent], slot: NoticeSlot
    ) -> None:
        """`offer_event` each of `events` in turn, in one call (a run stored together).

        Those the slot has room for are admitted together and encoded in one pass
        (`event_notes.event_entries`), the first carrying the drops before them; the
        rest are dropped and counted, carried by the next notification queued.
        """
        count = len(events)
        if not count:  # a run its conditions excluded whole
            return
        room = slot.limit - slot.queued if self.ready else 0
        if room < count:
            events = events[: max(room, 0)]
            if not events:
                self._dropped += count
                self._stats.dropped += count
                return
        carries, self._dropped = self._dropped, 0
        entries = event_entries(head, events, carries)
        if max(map(len, entries)) > self._max_message_bytes:  # rare: one is too big
            for entry, carried in zip(entries, chain((carries,), repeat(0)), strict=False):
                self._queue(entry, slot, carried)  # counts one too big dropped, oversized
        else:
            slot.queued += len(entries)
            self._count += len(entries)
            self._bytes += sum(map(len, entries))
            self._notes.append((entries, slot, carries))
        tail = count - len(events)
        if tail:
            self._dropped += tail
            self._stats.dropped += tail
        if self._writer_waits and self._notes:
            self._writer_waits = False
            self._wake_writer.set()

    def _queue(self, entry: bytes, slot: NoticeSlot, carries: int) -> None:
        if len(entry) > self._max_message_bytes:  # too big to send: dropped, counted
            self._dropped += carries + 1
            self._stats.dropped += 1
            self._stats.oversized += 1
            return
        slot.queued += 1
        self._count += 1
        self._bytes += len(entry)
        self._notes.append(([entry], slot, carries))
        if self._writer_waits:
            self._writer_waits = False
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
                self._writer_waits = True
                await self._wake_writer.wait()
                self._writer_waits = False

    def _next_notes(self) -> bytes | None:
        """The next message of notifications: one, or a batch of all that fit; None if none."""
        entries = self._take_notes(self._max_message_bytes, 1 << 30 if self.batches else 1)
        if len(entries) > 1:
            return batch_request(entries)
        return entries[0] if entries else None  # alone: the single form, the same bytes

    def _take_notes(self, room: int, most: int = 1 << 30) -> list[bytes]:
        """Batch entries of the oldest queued notifications that fit in `room` bytes.

        The first always goes: none queued is too big to send alone.
        """
        notes = self._notes
        if self._count <= most and self._bytes + BATCH_OVERHEAD <= room:  # all: the usual
            entries = list(chain.from_iterable(map(_ENTRIES_OF, notes)))
            for slot in set(map(_SLOT_OF, notes)):  # every one's notes go: none is left
                slot.queued = 0
            notes.clear()
            self._count = self._bytes = 0
            return entries
        entries = []
        size = BATCH_OVERHEAD
        while notes and len(entries) < most:
            run, slot, _ = notes[0]
            taken = 0
            for entry in run:
                size += len(entry)
                if (entries and size > room) or len(entries) == most:
                    break  # the rest goes in the next message
                entries.append(entry)
                self._bytes -= len(entry)
                taken += 1
            slot.queued -= taken
            self._count -= taken
            if taken < len(run):  # the run's rest stays first, its drops carried
                del run[:taken]
                if taken:
                    notes[0] = (run, slot, 0)
                break
            notes.popleft()
        return entries

    def clear(self) -> None:
        """The stream ended: its cancels are forgotten, its notifications dropped.

        The notifications still buffered are counted, and carried by the next one.
        """
        self._cancels.clear()
        for run, slot, carries in self._notes:
            slot.queued -= len(run)
            self._dropped += carries + len(run)
            self._stats.dropped += len(run)
        self._notes.clear()
        self._count = self._bytes = 0
