"""The ids of recently disposed agents, so that a call to one says so.

A disposed agent is gone from the registry, but a client that still calls it deserves
FAILED_PRECONDITION ("disposed"), not NOT_FOUND ("never existed"). The memory is
bounded: past `DISPOSED_MEMORY` ids the oldest is forgotten and answers NOT_FOUND
again, as it does after a restart. Reusing an id (create or resume) forgets it.
"""

from __future__ import annotations

from collections import OrderedDict

DISPOSED_MEMORY = 10_000
"""How many disposed agent ids one server process remembers."""


class DisposedIds:
    """A bounded, oldest-first-forgotten set of disposed agent ids."""

    def __init__(self, capacity: int = DISPOSED_MEMORY) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, agent_id: str) -> None:
        """Remember `agent_id` as disposed (the newest)."""
        self._ids[agent_id] = None
        self._ids.move_to_end(agent_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def discard(self, agent_id: str) -> None:
        """Forget `agent_id`: it names a live agent again."""
        self._ids.pop(agent_id, None)
