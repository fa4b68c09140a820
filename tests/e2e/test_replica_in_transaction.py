"""An owner stopped inside a transaction blocks no takeover and writes nothing after.

Two real replicas over the real embedded PostgreSQL. The owner is caught on purpose
in the middle of its lease renewal, a two-statement transaction: the test locks the
agent's lease row, so the owner's renewal (its heartbeat updated, its row lock held)
waits on it; the owner is SIGSTOPped right then and the test lets go of the row. The
renewal's second statement completes in the database, whose backend is then idle in a
transaction, holding the owner's rows, with a client that answers nothing: what a
replica paused or cut off mid-transaction looks like from the database. The survivor
takes the agent over within the documented bound all the same (the database ends the
quiet transaction after half a lease), clients see only truthful statuses, and the
woken owner adds nothing to the log: every accepted message there once, no turn twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import asyncpg

from agentloop.v1 import agent_factory_service_pb2 as fac
from tests.e2e.test_durability import T, word_count_options
from tests.e2e.test_replica_moves import Seen, check_the_move, load
from tests.e2e.test_replicas import LEASE, replicas
from tests.postgres import fresh_database


async def blocked_on_me(admin: asyncpg.Connection, seconds: float) -> int | None:
    """The backend waiting on a lock `admin` holds, if one does within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pid = await admin.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            admin.get_server_pid(),
        )
        if pid is not None:
            return int(pid)
        await asyncio.sleep(0.002)
    return None


async def backend_state(admin: asyncpg.Connection, backend: int) -> str | None:
    state = await admin.fetchval("SELECT state FROM pg_stat_activity WHERE pid = $1", backend)
    return None if state is None else str(state)


async def stop_inside_a_transaction(
    admin: asyncpg.Connection, owner_pid: int, agent_id: str
) -> tuple[int, float]:
    """SIGSTOP the owner with its backend idle in a transaction; (backend, when stopped).

    The owner renews every third of a lease; its renewal waits on the lease row this
    holds for at most its `lock_timeout` (a quarter of a lease), so the stop and the
    release must come in that window; an attempt that misses it is let go and retried.
    """
    for _ in range(20):
        transaction = admin.transaction()
        await transaction.start()
        await admin.execute("SELECT 1 FROM leases WHERE agent_id = $1 FOR UPDATE", agent_id)
        backend = await blocked_on_me(admin, 2 * LEASE)
        if backend is not None:
            os.kill(owner_pid, signal.SIGSTOP)
        stopped = time.monotonic()
        await transaction.rollback()
        if backend is None:
            continue
        for _ in range(100):  # the renewal's UPDATE goes through once the row is free
            state = await backend_state(admin, backend)
            if state != "active":
                break
            await asyncio.sleep(0.002)
        if state == "idle in transaction":
            return backend, stopped
        os.kill(owner_pid, signal.SIGCONT)  # caught elsewhere (its lock wait timed out)
        await asyncio.sleep(LEASE / 3)
    raise AssertionError("the owner was never caught inside its renewal")


async def test_an_owner_stopped_inside_a_transaction_is_taken_over_and_writes_nothing_after(
    tmp_path: Path, postgres_server: str
) -> None:
    dsn = await fresh_database(postgres_server)
    async with replicas(tmp_path, postgres_server, count=2, dsn=dsn) as (r0, r1):
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="m", options=word_count_options()), timeout=T
        )
        session_id = created.agent.session_id
        seen = Seen()
        through_r1 = asyncio.create_task(load(r1, "r1", seen))
        await asyncio.sleep(1.0)  # sends forwarded to r0, which commits them
        admin = await asyncpg.connect(dsn)
        pid = r0.process.process.pid
        try:
            backend, stopped = await stop_inside_a_transaction(admin, pid, "m")
            try:
                await asyncio.sleep(3 * LEASE)
                # the database ended the quiet transaction: its locks, and its connection, are gone
                assert await backend_state(admin, backend) is None
            finally:
                os.kill(pid, signal.SIGCONT)
        finally:
            await admin.close()
        through_r0 = asyncio.create_task(load(r0, "r0", seen))  # the woken owner
        await asyncio.sleep(2 * LEASE)
        for task in (through_r1, through_r0):
            task.cancel()
        await asyncio.gather(through_r1, through_r0, return_exceptions=True)

        takeover, _ = await check_the_move(seen, stopped, r0, r1, session_id)
        print(f"takeover {takeover:.2f} s after the stop inside a transaction")
