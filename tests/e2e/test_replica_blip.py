"""A database blip moves no agent: owners that reconnect within their lease keep them.

Two real replicas over the real embedded PostgreSQL, each owning two agents, with a
client sending (request ids, retried with the same id) and reading through both
replicas all along. PostgreSQL is stopped for two leases and started again: in the
database's clock every lease has lapsed by then. One owner (r0) reaches PostgreSQL
through a fault proxy that stays blackholed for another 0.4 lease after the database
is back, so the other replica (r1) is in touch first: without a grace its sweep takes
r0's lapsed leases. Each owner renews its own lapsed leases when it reconnects, and
neither replica sweeps before it has been in touch for a whole lease (the grace), so
no agent changes hands: the leases name the same owners after as before, no log says
"taking over", no turn is interrupted, clients see only OK or `UNAVAILABLE` (with a
reason and a retry delay), and every accepted message is in its log once.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import asyncpg
from grpc_health.v1 import health_pb2

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.test_durability import Server, T, running_server, word_count_options
from tests.e2e.test_replica_moves import Seen
from tests.e2e.test_replica_outage import readiness
from tests.e2e.test_replicas import LEASE, read_log, request_ids, wait_idle
from tests.faultproxy import postgres_proxy
from tests.invariants import check_log
from tests.postgres import fresh_database, restart

AGENTS = {"r0": ("a0", "a1"), "r1": ("b0", "b1")}


async def owners(dsn: str) -> dict[str, str]:
    """Each leased agent's owner, read from the database."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT agent_id, owner FROM leases ORDER BY agent_id")
    finally:
        await conn.close()
    return {row["agent_id"]: row["owner"] for row in rows}


async def sends(server: Server, name: str, agent_ids: list[str], seen: Seen) -> None:
    """Round robin over the agents: a read, then a send retried with its id until accepted."""
    n = 0
    while True:
        agent_id = agent_ids[n % len(agent_ids)]
        await seen.call("GetAgent", server.factory.GetAgent(
            fac.GetAgentRequest(agent_id=agent_id), timeout=5))  # fmt: skip
        request_id = f"{name}-{n}"
        send = api.SendMessageRequest(agent_id=agent_id, text="count words", request_id=request_id)
        for _ in range(200):
            if await seen.call("SendMessage", server.agents.SendMessage(send, timeout=5)):
                seen.accepted.append(request_id)
                break
            await asyncio.sleep(0.1)
        n += 1
        await asyncio.sleep(0.05)


async def test_a_postgres_restart_longer_than_the_lease_moves_no_agent(
    tmp_path: Path, postgres_server: str, postgres_instance: Any
) -> None:
    dsn = await fresh_database(postgres_server)
    async with postgres_proxy(dsn) as (proxy, proxied), contextlib.AsyncExitStack() as stack:
        servers: list[Server] = []
        for name, url in zip(AGENTS, (proxied, dsn), strict=True):
            config = (
                f"agents: []\nstore: postgres\npostgresDsn: '{url}'\n"
                f"replicaId: {name}\nleaseSeconds: {LEASE}\n"
            )
            servers.append(await stack.enter_async_context(running_server(tmp_path, config)))
        sessions: dict[str, str] = {}
        for server, agent_ids in zip(servers, AGENTS.values(), strict=True):
            for agent_id in agent_ids:
                created = await server.factory.CreateAgent(
                    fac.CreateAgentRequest(agent_id=agent_id, options=word_count_options()),
                    timeout=T,
                )
                sessions[agent_id] = created.agent.session_id
        before = await owners(dsn)
        assert before == {a: r for r, ids in AGENTS.items() for a in ids}, before

        seen = Seen()
        everyone = sorted(sessions)
        load = [
            asyncio.create_task(sends(server, f"via{i}", everyone, seen))
            for i, server in enumerate(servers)
        ]
        await asyncio.sleep(1.0)
        down = asyncio.create_task(restart(postgres_instance, down_seconds=2 * LEASE))
        await asyncio.sleep(0.2)
        proxy.blackhole()  # r0 stays cut off a little longer than the database is down
        try:
            await down
            await asyncio.sleep(0.4 * LEASE)
        finally:
            proxy.heal()
        for server in servers:  # both reconnect by themselves
            for _ in range(100):
                if await readiness(server) == health_pb2.HealthCheckResponse.SERVING:
                    break
                await asyncio.sleep(0.1)
        await asyncio.sleep(3 * LEASE)  # past the grace and several sweeps
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)

        assert await owners(dsn) == before  # no agent changed hands
        for server in servers:
            assert "taking over agent" not in server.log(), server.log()
            assert "was lost" not in server.log(), server.log()
        codes = {(code, reason) for _, _, code, reason in seen.calls}
        assert {code for code, _ in codes} <= {"OK", "UNAVAILABLE"}, codes
        assert {reason for code, reason in codes if code == "UNAVAILABLE"} <= {
            "STORE_UNAVAILABLE",
            "AGENT_MOVING",
        }, codes
        assert ("UNAVAILABLE", "STORE_UNAVAILABLE") in codes or (
            "UNAVAILABLE",
            "AGENT_MOVING",
        ) in codes, codes  # the outage was seen
        accepted: list[str] = []
        for agent_id, session_id in sessions.items():
            await wait_idle(servers[0], agent_id)
            stored = await read_log(servers[0], session_id)
            check_log(stored)
            interrupted = [
                e
                for e in stored
                if e.HasField("turn_end") and e.turn_end.reason.HasField("interrupted")
            ]
            assert not interrupted, interrupted  # no turn was cut by a move
            ids = request_ids(stored)
            assert len(ids) == len(set(ids)), ids
            accepted.extend(ids)
        assert set(seen.accepted) <= set(accepted)  # nothing accepted was lost
        print(f"{len(seen.calls)} calls through the restart: {sorted(codes)}")
