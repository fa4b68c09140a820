"""Idempotent calls: a retry with the same request id gets the first call's answer.

A mutating agent call (send, steer, inject) may carry a client-chosen request id.
The first call's answer is stored in the same commit as the message it accepted
(`SessionLog.record` in the same tick as the verb), so "accepted" and "answered" are
one durable fact: a retry after a timeout, a disconnect or a restart finds the answer
and queues nothing. Concurrent duplicates in this process wait for the first one
instead of racing it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from server.core.errors import InvalidArgument
from server.stores import SessionStore

MAX_REQUEST_ID = 128
"""The longest request id accepted, in characters."""


def check_request_id(request_id: str) -> None:
    """Refuse a request id that is too long or not printable."""
    if len(request_id) > MAX_REQUEST_ID:
        raise InvalidArgument("request_id", f"must be at most {MAX_REQUEST_ID} characters")
    if not request_id.isprintable():
        raise InvalidArgument("request_id", "must be printable characters")


RECENT = 10_000
"""Answers kept in memory after their commit, for duplicates whose store lookup raced it."""


class Requests:
    """Deduplicates calls by (agent id, request id).

    The first call runs in a task of its own, not in the caller's: a caller that
    gives up (its deadline passed while the commit was slow) does not take the
    in-flight entry with it, so a retry waits for the same commit instead of
    accepting the message again.
    """

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._in_flight: dict[tuple[str, str], asyncio.Future[bytes]] = {}
        self._recent: OrderedDict[tuple[str, str], tuple[str, bytes]] = OrderedDict()

    async def once(
        self, agent_id: str, request_id: str, method: str, run: Callable[[], Awaitable[bytes]]
    ) -> bytes:
        """The answer of the first call with this id: `run()` if there was none yet."""
        if not request_id:
            return await run()
        check_request_id(request_id)
        key = (agent_id, request_id)
        first = self._in_flight.get(key)
        if first is None:
            stored = self._recent.get(key)
            if stored is None:
                record = await self.store.find_request(agent_id, request_id)
                # The lookup may have read before a first call committed: look again.
                stored = (record.method, record.response) if record else self._recent.get(key)
            if stored is not None:
                if stored[0] != method:
                    raise InvalidArgument(
                        "request_id", f'"{request_id}" was used for {stored[0]}, not {method}'
                    )
                return stored[1]
            first = self._in_flight.get(key)  # a duplicate may have started meanwhile
        if first is None:
            first = asyncio.ensure_future(run())
            self._in_flight[key] = first
            first.add_done_callback(lambda done: self._settled(key, method, done))
        return await asyncio.shield(first)

    def _settled(self, key: tuple[str, str], method: str, done: asyncio.Future[bytes]) -> None:
        if self._in_flight.get(key) is done:
            del self._in_flight[key]
        if done.cancelled() or done.exception() is not None:
            return  # not accepted: a retry runs again
        self._recent[key] = (method, done.result())
        while len(self._recent) > RECENT:
            self._recent.popitem(last=False)
