"""A session's durable inbox: accepted messages that no event records yet.

`SendMessage`, `SteerMessage` and `InjectContext` put their message here when they
accept it; the entry is stored with the next group commit, and it leaves the inbox in
the same commit as the event that records it (`consume`), so a message is pending or
recorded, never both and never neither.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from agentloop.v1 import session_event_pb2 as ev
from server.stores import InboxEntry


class DurableInbox:
    """The pending entries of one session, by entry id."""

    def __init__(self, entries: Sequence[InboxEntry] = ()) -> None:
        self.entries: dict[int, InboxEntry] = {entry.entry_id: entry for entry in entries}
        self._next = max(self.entries, default=0) + 1

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[int]:
        return iter(self.entries)

    def __getitem__(self, entry_id: int) -> InboxEntry:
        return self.entries[entry_id]

    def pending(self) -> list[InboxEntry]:
        """The entries in the order they were accepted."""
        return [self.entries[key] for key in sorted(self.entries)]

    def accept(self, kind: str, message: ev.UserMessage | ev.ContextMessage) -> InboxEntry:
        """A new entry for an accepted message (the caller stores it)."""
        entry = InboxEntry(self._next, kind, message)
        self._next += 1
        self.entries[entry.entry_id] = entry
        return entry

    def adopt(self, entries: Sequence[InboxEntry]) -> None:
        """Take up entries the store already moved to this session."""
        for entry in entries:
            self.entries[entry.entry_id] = entry
        self._next = max(self.entries, default=0) + 1

    def consume(self, entry_ids: Sequence[int]) -> None:
        """The entries an event records leave the inbox."""
        for entry_id in entry_ids:
            self.entries.pop(entry_id, None)
