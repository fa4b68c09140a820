"""No lock outlives a round trip: a replica gone quiet inside a transaction blocks no one.

In-process over the real embedded PostgreSQL, two stores on one database stand for two
replicas. One of them opens a transaction on the pool, locks a session's row as a
commit does, and goes quiet (what the database sees of a replica paused by SIGSTOP or
cut off mid-commit). The other one's claim of that session (a takeover) is not held
for the pause: the database ends the quiet transaction after half a lease and the
claim goes through; the quiet replica's connection is gone, so nothing it sends after
waking lands. Lease sweeps skip locked rows; the pool's settings are the documented
ones; a replica whose renewal is late has its commits refused as an outage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from agentloop.v1 import session_pb2
from server.stores import Commit, StoreUnavailable
from server.stores.postgres import PostgresStore
from server.stores.postgres_leases import Leases
from server.stores.postgres_outage import OUTAGES
from server.stores.postgres_pool import session_settings
from tests.postgres import drop_database, fresh_database

LEASE = 1.0


@pytest.fixture
async def two(postgres_server: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    dsn = await fresh_database(postgres_server)
    stores = (PostgresStore(dsn, lease_seconds=LEASE), PostgresStore(dsn, lease_seconds=LEASE))
    for store in stores:
        await store.open()
    try:
        yield stores
    finally:
        for store in stores:
            await store.close()
        await drop_database(postgres_server, dsn)


async def a_session(store: PostgresStore, session_id: str) -> None:
    commit = Commit()
    commit.of(session_id).create = session_pb2.SessionHeader(cwd="/")
    await store.commit(commit)


async def claimed(store: PostgresStore, session_id: str) -> int:
    """A claim, retried as a sweep retries a takeover while a lock times it out."""
    for _ in range(100):
        try:
            return await store.claim(session_id)
        except StoreUnavailable:  # lock_timeout: a quarter of a lease
            await asyncio.sleep(0.05)
    raise AssertionError("never claimed")


async def test_a_quiet_transaction_is_ended_and_a_takeover_goes_through(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    paused, survivor = two
    await a_session(paused, "s")
    pool = await paused.pool()
    conn = await pool.acquire()
    try:
        transaction = conn.transaction()
        await transaction.start()
        await conn.execute("SELECT fence FROM sessions WHERE session_id = 's' FOR UPDATE")
        started = time.monotonic()
        token = await asyncio.wait_for(claimed(survivor, "s"), timeout=10 * LEASE)
        waited = time.monotonic() - started
        assert token == 1
        assert waited < 3 * LEASE, waited  # held for about half a lease, not for the pause
        with pytest.raises(OUTAGES):  # the database ended it: the connection is gone
            await conn.execute("UPDATE sessions SET fence = 100 WHERE session_id = 's'")
    finally:
        await pool.release(conn)
    assert await survivor.claim("s") == 2  # the woken writer's update never landed


async def test_a_lease_sweep_skips_a_lease_another_replica_has_locked(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    one, other = two
    mine = Leases(one, "r0", "a:1", LEASE)
    theirs = Leases(other, "r1", "b:1", LEASE)
    await mine.register()
    await theirs.register()
    for agent_id in ("x", "y"):
        assert await mine.acquire(agent_id, f"{agent_id}-s", b"") is None
    await mine.hand_over()  # both expired: up for takeover
    pool = await one.pool()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM leases WHERE agent_id = 'x' FOR UPDATE")
        started = time.monotonic()
        taken = await asyncio.wait_for(theirs.take_over(), timeout=10 * LEASE)
        assert time.monotonic() - started < LEASE  # did not wait for the locked row
    assert [lease.agent_id for lease in taken] == ["y"]


async def test_every_connection_runs_with_the_documented_timeouts(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    store, _ = two
    pool = await store.pool()
    expected = session_settings(LEASE)
    async with pool.acquire() as conn:
        for name in ("idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout"):
            shown = await conn.fetchval("SELECT setting FROM pg_settings WHERE name = $1", name)
            assert shown == expected[name], (name, shown)
    assert expected["idle_in_transaction_session_timeout"] == "500"
    assert expected["lock_timeout"] == "250"


async def test_a_replica_whose_renewal_is_late_writes_nothing(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    store, _ = two
    store.may_write = lambda: False
    commit = Commit()
    commit.of("late").create = session_pb2.SessionHeader(cwd="/")
    with pytest.raises(StoreUnavailable):
        await store.commit(commit)
    assert not await store.exists("late")
