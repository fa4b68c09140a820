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
from collections.abc import Awaitable, Callable

from server.errors import InvalidArgument
from server.stores import SessionStore

MAX_REQUEST_ID = 128
"""The longest request id accepted, in characters."""


def check_request_id(request_id: str) -> None:
    """Refuse a request id that is too long or not printable."""
    if len(request_id) > MAX_REQUEST_ID:
        raise InvalidArgument("request_id", f"must be at most {MAX_REQUEST_ID} characters")
    if not request_id.isprintable():
        raise InvalidArgument("request_id", "must be printable characters")


class Requests:
    """Deduplicates calls by (agent id, request id)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._in_flight: dict[tuple[str, str], asyncio.Future[bytes]] = {}

    async def once(
        self, agent_id: str, request_id: str, method: str, run: Callable[[], Awaitable[bytes]]
    ) -> bytes:
        """The answer of the first call with this id: `run()` if there was none yet."""
        if not request_id:
            return await run()
        check_request_id(request_id)
        key = (agent_id, request_id)
        while True:
            first = self._in_flight.get(key)
            if first is None:
                stored = await self.store.find_request(agent_id, request_id)
                if stored is not None:
                    if stored.method != method:
                        raise InvalidArgument(
                            "request_id",
                            f'"{request_id}" was used for {stored.method}, not {method}',
                        )
                    return stored.response
                first = self._in_flight.get(key)  # a duplicate may have started meanwhile
            if first is None:
                return await self._first(key, run)
            try:
                return await asyncio.shield(first)
            except asyncio.CancelledError:
                if not first.cancelled():
                    raise  # this call was cancelled
                # The first call was cancelled before it answered: try again.

    async def _first(self, key: tuple[str, str], run: Callable[[], Awaitable[bytes]]) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            answer = await run()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved here: a duplicate that never came is no error
            raise
        finally:
            del self._in_flight[key]
        future.set_result(answer)
        return answer
