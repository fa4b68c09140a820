"""The connections to PostgreSQL: bounded so that no lock outlives a round trip.

A replica paused or cut off inside a transaction holds its row locks until the
database notices; a survivor's takeover waits on them. Every connection of the pool
therefore runs with (in PostgreSQL's own settings, derived from the lease time L):

- `idle_in_transaction_session_timeout` = L/2: a transaction whose client went quiet
  between statements (a SIGSTOP, a partition, a stalled loop) is ended by the
  database and its locks released, before the lease can even expire;
- `lock_timeout` = L/4: a statement never waits long on another replica's lock (it
  fails as an outage and is retried; lease and takeover queries skip locked rows);
- `statement_timeout` = max(L, 5 s), with the same client-side `command_timeout`
  (plus a second): a statement that takes longer is an outage, also when the
  network is silent and the server cannot tell the client so;
- TCP keepalives and `tcp_user_timeout` (TCP connections; a Unix socket has no
  partitions): the server drops a peer that vanished within about L.
"""

from __future__ import annotations

import math

import asyncpg

MIN_TIMEOUT = 0.1
"""Seconds: the shortest of the derived timeouts (a very short lease still gets these)."""

STATEMENT_FLOOR = 5.0
"""Seconds: statements may take at least this long, whatever the lease (a large load)."""


def _ms(seconds: float) -> str:
    return str(max(int(seconds * 1000), int(MIN_TIMEOUT * 1000)))


def session_settings(lease_seconds: float) -> dict[str, str]:
    """The PostgreSQL settings of every pooled connection, for a lease of `lease_seconds`."""
    lease = lease_seconds
    return {
        "idle_in_transaction_session_timeout": _ms(lease / 2),
        "lock_timeout": _ms(lease / 4),
        "statement_timeout": _ms(max(lease, STATEMENT_FLOOR)),
        "tcp_keepalives_idle": str(max(1, math.ceil(lease / 2))),
        "tcp_keepalives_interval": "1",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": _ms(lease),
        "application_name": "agentloop",
    }


async def _as_left(conn: asyncpg.Connection) -> None:
    """Give a connection back to the pool as it is: no reset query, no round trip.

    The store leaves no session state on a pooled connection (no LISTEN, no cursor,
    no setting changed, no advisory lock held past its statement: those have
    connections of their own), so asyncpg's default reset (`RESET ALL`, `UNLISTEN *`,
    ... one round trip at every release) would only double the round trips of a commit
    or a read. A connection given back inside a transaction is still rolled back.
    """


async def create_pool(dsn: str, size: int, lease_seconds: float) -> asyncpg.Pool:
    """A pool of connections with the settings above; connecting waits at most a lease.

    Connections are made on demand and kept once made; the health probe reconnects.
    Statements are prepared once per connection and kept (asyncpg's statement cache):
    a commit or a read is then one round trip.
    """
    return await asyncpg.create_pool(
        dsn,
        min_size=0,  # no floor to restore in the background (a traceback a second) in an outage
        max_size=size,
        timeout=max(lease_seconds, 1.0),
        command_timeout=max(lease_seconds, STATEMENT_FLOOR) + 1,
        server_settings=session_settings(lease_seconds),
        reset=_as_left,
    )
