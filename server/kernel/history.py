"""A snapshot of the history that costs nothing to take: a frozen view of a growing list.

A session's history only grows between two replacements (a compaction builds a new
list), so the first `n` messages of its list never change: a view of them, behind a
prefix, is what a step's model request reads, without copying the history per step.
The view has no mutating method; the messages themselves are shared, as they were in
a list copy (a request's messages are not to be mutated).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import overload

from agentloop.v1 import content_pb2 as c


class MessageView(Sequence[c.Message]):
    """`prefix` followed by the first `length` messages of `items`, which only grows."""

    __slots__ = ("_prefix", "_items", "_length")

    def __init__(
        self, items: list[c.Message], length: int, prefix: Sequence[c.Message] = ()
    ) -> None:
        self._prefix = prefix
        self._items = items
        self._length = length

    def behind(self, prefix: Sequence[c.Message]) -> MessageView:
        """The same messages behind `prefix` (in place of this view's own)."""
        return MessageView(self._items, self._length, prefix)

    def split(self) -> tuple[Sequence[c.Message], list[c.Message], int]:
        """The prefix, the growing list, and how many of its first messages follow the prefix.

        For an encoding kept from one request to the next (`server.models.appended`):
        the list is only ever appended to, so its first messages stay what they were.
        """
        return self._prefix, self._items, self._length

    def __len__(self) -> int:
        return len(self._prefix) + self._length

    @overload
    def __getitem__(self, index: int) -> c.Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[c.Message]: ...

    def __getitem__(self, index: int | slice) -> c.Message | list[c.Message]:
        """A message, or a slice as a new list (of that slice only)."""
        size = len(self)
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(size))]
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("message index out of range")
        return self._at(index)

    def _at(self, index: int) -> c.Message:
        head = len(self._prefix)
        return self._prefix[index] if index < head else self._items[index - head]

    def __iter__(self) -> Iterator[c.Message]:
        return itertools.chain(self._prefix, itertools.islice(self._items, self._length))

    def __reversed__(self) -> Iterator[c.Message]:
        return (self._at(i) for i in range(len(self) - 1, -1, -1))

    def __eq__(self, other: object) -> bool:
        """Equal to a list, tuple or view of equal messages, in order (as a list would be)."""
        if not isinstance(other, list | tuple | MessageView):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # unhashable, like a list

    def __repr__(self) -> str:
        return f"MessageView({list(self)!r})"
