"""Idempotent calls: a retry with the same request id gets the first call's answer.

A mutating agent call (send, steer, inject) may carry a client-chosen request id.
The first call's answer is stored in the same commit as the message it accepted
(`SessionLog.record` in the same tick as the verb), so "accepted" and "answered" are
one durable fact: a retry after a timeout, a disconnect or a restart finds the answer
and queues nothing. Concurrent duplicates in this process wait for the first one
instead of racing it.

A new id costs no store read: for each live agent (the object that drives it here) the
ids that may be stored for it are kept in memory, read from the store once when it
first gets a call with an id; an id outside a complete set was never used. An id in
the set, or any id of an agent whose ids did not fit in memory, is looked up in the
store as before, so a retry after a restart (a new live agent) is still found.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from server.kernel.errors import InvalidArgument
from server.stores import SessionStore, StoreUnavailable

if TYPE_CHECKING:
    from server.sessions.session import SessionLog

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

OUTAGE_POLL = 0.25
"""Seconds between two looks at the store's health while a first call waits for its commit."""

KNOWN_IDS = 100_000
"""Request ids kept in memory over all live agents, to tell a new id without the store.
An agent whose ids do not fit any more falls back to a store read per call."""


class _Known:
    """The ids that may be stored for one live agent."""

    __slots__ = ("complete", "dropped", "ids")

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.complete = False
        """Whether `ids` holds every id stored for the agent (read from the store)."""
        self.dropped = False
        """Whether the ids did not fit: the store is asked for every id of the agent."""

    def drop(self) -> int:
        """Forget the ids (they did not fit); returns how many there were."""
        count = len(self.ids)
        self.ids.clear()
        self.complete, self.dropped = False, True
        return count


class Requests:
    """Deduplicates calls by (agent id, request id).

    The first call runs in a task of its own, not in the caller's (or, accepted at
    once, is a future of its commit): a caller that gives up (its deadline passed
    while the commit was slow) does not take the in-flight entry with it, so a retry
    waits for the same commit instead of accepting the message again.
    """

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._in_flight: dict[tuple[str, str], asyncio.Future[bytes]] = {}
        self._recent: OrderedDict[tuple[str, str], tuple[str, bytes]] = OrderedDict()
        self._known: weakref.WeakKeyDictionary[object, _Known] = weakref.WeakKeyDictionary()
        """Per live agent (the `owner` of its calls), the ids that may be stored for it."""
        self._known_count = 0
        """An upper bound of the ids in `_known` (entries of disposed agents go unseen)."""

    async def once(
        self,
        agent_id: str,
        request_id: str,
        method: str,
        run: Callable[[], Awaitable[bytes]],
        owner: object | None = None,
    ) -> bytes:
        """The answer of the first call with this id: `run()` if there was none yet.

        `owner` is the live object the calls of `agent_id` go to here (the agent): while
        it lives, ids are told new from memory. None: every new id is looked up.
        """
        if not request_id:
            return await run()
        check_request_id(request_id)
        key = (agent_id, request_id)
        earlier = await self._earlier(key, method, owner)
        if isinstance(earlier, bytes):
            return earlier
        if earlier is None:
            earlier = asyncio.ensure_future(run())
            self._begin(key, method, earlier, owner)
        return await self._answer(earlier)

    async def accept_once(
        self,
        agent_id: str,
        request_id: str,
        method: str,
        accept: Callable[[], bytes],
        session: SessionLog,
        owner: object | None = None,
    ) -> bytes:
        """`once` of a call that `accept` accepts at once, answered when `session` commits.

        `accept` writes to `session` (the answer recorded with what it accepted) and
        returns the answer. Duplicates wait for a future of that commit; the first call
        waits with a waiter of its own (`SessionLog.settle`), which its cancellation
        may take along: the shared future needs no shield (two loop passes) for it.
        """
        check_request_id(request_id)
        key = (agent_id, request_id)
        earlier = await self._earlier(key, method, owner)
        if isinstance(earlier, bytes):
            return earlier
        if earlier is not None:
            return await self._answer(earlier)
        answer = accept()
        first = _once_stored(session, answer)
        self._begin(key, method, first, owner)
        if getattr(self.store, "health", None) is not None:
            return await self._answer(first)  # an outage ends the wait (`_answer`)
        await session.settle()  # the same commit as `first`'s, or its refusal
        return answer

    async def _earlier(
        self, key: tuple[str, str], method: str, owner: object | None
    ) -> bytes | asyncio.Future[bytes] | None:
        """An earlier call's answer, the future of one in flight, or None: the first."""
        first = self._in_flight.get(key)
        if first is not None:
            return first
        stored = self._recent.get(key)
        if stored is None and not await self._unused(owner, *key):
            record = await self.store.find_request(*key)
            # The lookup may have read before a first call committed: look again.
            stored = (record.method, record.response) if record else self._recent.get(key)
        if stored is not None:
            if stored[0] != method:
                raise InvalidArgument(
                    "request_id", f'"{key[1]}" was used for {stored[0]}, not {method}'
                )
            return stored[1]
        return self._in_flight.get(key)  # a duplicate may have started meanwhile

    def _begin(
        self,
        key: tuple[str, str],
        method: str,
        first: asyncio.Future[bytes],
        owner: object | None,
    ) -> None:
        """`first` is the call in flight for `key`: duplicates wait for it."""
        self._in_flight[key] = first
        known = self._known.get(owner) if owner is not None else None
        first.add_done_callback(lambda done: self._settled(key, method, done, known))

    async def _answer(self, first: asyncio.Future[bytes]) -> bytes:
        """The first call's answer; `StoreUnavailable` if the store is unreachable meanwhile.

        The first call goes on (its commit is retried until the store is back): a retry
        with the same id waits for it again, or finds its answer.
        """
        health = getattr(self.store, "health", None)  # a shared store that can be away
        if health is None:
            return await asyncio.shield(first)
        while True:
            done, _ = await asyncio.wait({first}, timeout=OUTAGE_POLL)
            if done:
                return first.result()
            if not health.reachable:
                raise StoreUnavailable("the session store is unreachable; retry later")

    async def _unused(self, owner: object | None, agent_id: str, request_id: str) -> bool:
        """Whether `request_id` was certainly never recorded for the agent (no store read).

        The first call for a live agent reads its stored ids once; calls meanwhile, and
        those of an agent whose ids did not fit, say "not certain" (the store decides).
        """
        if owner is None:
            return False
        known = self._known.get(owner)
        if known is not None:
            return known.complete and request_id not in known.ids
        known = self._known[owner] = _Known()  # before the read: ids settled meanwhile join
        room = KNOWN_IDS - self._known_count
        if room <= 0:
            self._known_count = sum(len(k.ids) for k in self._known.values())
            room = KNOWN_IDS - self._known_count
        stored = await self.store.request_ids(agent_id, room) if room > 0 else None
        if stored is None:
            self._known_count -= known.drop()
        elif not known.dropped:
            known.ids.update(stored)
            known.complete = True
            self._known_count += len(stored)
        return False  # this call looks the id up as before: the set was not whole until now

    def _settled(
        self,
        key: tuple[str, str],
        method: str,
        done: asyncio.Future[bytes],
        known: _Known | None,
    ) -> None:
        if self._in_flight.get(key) is done:
            del self._in_flight[key]
        if known is not None and not known.dropped:
            # Stored, or maybe stored (a failure after the record), maybe after the read of
            # the stored ids: either way, a later call with this id asks the store.
            known.ids.add(key[1])
            self._known_count += 1
            if self._known_count > KNOWN_IDS:
                self._known_count = sum(len(k.ids) for k in self._known.values())
                if self._known_count > KNOWN_IDS:  # no room: this agent asks the store
                    self._known_count -= known.drop()
        if done.cancelled() or done.exception() is not None:
            return  # not accepted: a retry runs again
        self._recent[key] = (method, done.result())
        while len(self._recent) > RECENT:
            self._recent.popitem(last=False)


def _once_stored(session: SessionLog, answer: bytes) -> asyncio.Future[bytes]:
    """`answer`, once everything `session` wrote so far is stored (as `SessionLog.settle`).

    The store's refusal of the session instead, if it refused it.
    """
    result: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def settled(_: object = None) -> None:
        if result.done():  # cancelled: nobody waits for it
            return
        if session.failure is not None:
            result.set_exception(session.failure)
        else:
            result.set_result(answer)

    stored = session.journal.sync() if session.journal is not None else None
    if stored is None or stored.done():
        settled()
    else:
        stored.add_done_callback(settled)
    return result
