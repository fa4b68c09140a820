"""What a PostgreSQL outage looks like, and how it reaches callers: `StoreUnavailable`.

A restart, a partition or a lock held too long surfaces from asyncpg in many shapes
(`ConnectionRefusedError`, `CannotConnectNowError`, a connection closed mid-query, a
statement or lock timeout). Each public coroutine of a store class wrapped by
`outages_unavailable` raises them as `StoreUnavailable` (the status `UNAVAILABLE`
with a retry delay, never the driver's text), and tells the store's `StoreHealth`,
which probes the database with backoff until it answers again (readiness meanwhile
says "not ready").
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from server.stores import StoreUnavailable

log = logging.getLogger(__name__)

OUTAGES: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, unreachable
    TimeoutError,  # connect or command timeout
    asyncpg.InterfaceError,  # the connection closed under a query; the pool is closing
    asyncpg.exceptions.InternalClientError,  # a connection the server ended mid-transaction
    asyncpg.exceptions.PostgresConnectionError,  # SQLSTATE class 08
    asyncpg.exceptions.OperatorInterventionError,  # 57: shutdown, starting up, canceled
    asyncpg.exceptions.InsufficientResourcesError,  # 53: too many connections
    asyncpg.exceptions.LockNotAvailableError,  # lock_timeout, NOWAIT
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
)
"""Errors that say "the database cannot serve this now", not "this is wrong"."""

BUSY: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.QueryCanceledError,  # statement_timeout
)
"""Outages of one statement (another replica's lock, a timeout), not of the database."""

PROBE_FIRST = 0.1
PROBE_MAX = 2.0
"""Seconds between probes of an unreachable database: doubling from the first, capped."""

PROBE_TIMEOUT = 2.0


class StoreHealth:
    """Whether the database answers; after a failure, probes it with backoff until it does."""

    def __init__(self, probe: Callable[[], Awaitable[None]]) -> None:
        self.probe = probe
        self.reachable = True
        self.on_change: Callable[[bool], None] = lambda reachable: None
        self._probing: asyncio.Task[None] | None = None

    def failed(self) -> None:
        """An operation met an outage: not reachable until a probe succeeds."""
        if self._probing is not None and not self._probing.done():
            return
        if self.reachable:
            log.warning("the PostgreSQL store is unreachable; reconnecting")
            self.reachable = False
            self.on_change(False)
        self._probing = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = PROBE_FIRST
        while True:
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # jitter: replicas spread
            try:
                await asyncio.wait_for(self.probe(), PROBE_TIMEOUT)
            except OUTAGES:
                delay = min(2 * delay, PROBE_MAX)
                continue
            except Exception:
                log.warning("probing the PostgreSQL store failed", exc_info=True)
                delay = min(2 * delay, PROBE_MAX)
                continue
            log.info("the PostgreSQL store is reachable again")
            self.reachable = True
            self.on_change(True)
            return

    async def close(self) -> None:
        """Stop probing."""
        if self._probing is not None:
            self._probing.cancel()
            await asyncio.gather(self._probing, return_exceptions=True)


Cls = TypeVar("Cls", bound=type)


def outages_unavailable(health: Callable[[Any], StoreHealth]) -> Callable[[Cls], Cls]:
    """Wrap every public coroutine method of a class: outages become `StoreUnavailable`.

    `health` finds the instance's `StoreHealth`, told of each outage.
    """

    def decorate(cls: Cls) -> Cls:
        for name, method in list(vars(cls).items()):
            if name.startswith("_") or not inspect.iscoroutinefunction(method):
                continue
            setattr(cls, name, _guarded(method, health))
        return cls

    return decorate


def _guarded(
    method: Callable[..., Awaitable[Any]], health: Callable[[Any], StoreHealth]
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except OUTAGES as error:
            if not isinstance(error, BUSY):
                health(self).failed()
            log.debug("PostgreSQL outage in %s: %r", method.__qualname__, error)
            raise StoreUnavailable("the session store is unreachable; retry later") from error

    return guarded
