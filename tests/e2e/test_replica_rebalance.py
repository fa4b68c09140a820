"""Agents move between turns: rebalancing after a restart, and `agentloop drain`.

Real replicas over the real embedded PostgreSQL, a client keeping turns running (sends
with request ids, each turn calling `sleep`, retried with the same id while refused):
- a replica killed and started again gets a fair share of the agents back: the
  replica that took them all over hands some over, each between two of its turns;
- `agentloop drain r0` (the CLI, through the other replica) hands every agent of r0
  over between turns, answers with their ids, and r0 exits by itself (code 0); a
  Python SDK stream by agent id through r1 (forwarded to r0, ended `AGENT_MOVING` by
  the hand-over) waits the server's delay and resumes: it sees the log whole, once;
- SIGTERM on r0 does the same before it exits (without the hand-over its running
  turns would end `disposed`).
In both, no turn is interrupted, clients see only OK or `UNAVAILABLE` (`AGENT_MOVING`
or `STORE_UNAVAILABLE`, with a retry delay), and every accepted message is in its
session's log once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import grpc
import pytest

from agentloop.client import connect
from agentloop.errors import FailedPrecondition
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.conftest import E2E
from tests.e2e.test_durability import Server, T, running_server
from tests.e2e.test_replica_moves import Seen
from tests.e2e.test_replicas import LEASE, read_log, request_ids, sleeper, wait_idle
from tests.invariants import check_log
from tests.postgres import fresh_database
from tests.test_cli import run_cli


def config(dsn: str, name: str) -> str:
    return (
        f"agents: []\nstore: postgres\npostgresDsn: '{dsn}'\n"
        f"replicaId: {name}\nleaseSeconds: {LEASE}\n"
    )


async def owners(dsn: str) -> dict[str, str]:
    """Each leased agent's owner, read from the database."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT agent_id, owner FROM leases ORDER BY agent_id")
    finally:
        await conn.close()
    return {row["agent_id"]: row["owner"] for row in rows}


async def turns(server: Server, agent_ids: list[str], seen: Seen, name: str) -> None:
    """Round robin: a send (a turn that sleeps), retried with its id until accepted."""
    n = 0
    while True:
        agent_id = agent_ids[n % len(agent_ids)]
        request_id = f"{name}-{n}"
        send = api.SendMessageRequest(agent_id=agent_id, text="go", request_id=request_id)
        for _ in range(300):
            if await seen.call("SendMessage", server.agents.SendMessage(send, timeout=5)):
                seen.accepted.append(request_id)
                break
            await asyncio.sleep(0.1)
        n += 1
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def load(server: Server, agent_ids: list[str], seen: Seen) -> AsyncIterator[None]:
    task = asyncio.create_task(turns(server, agent_ids, seen, "c"))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def check_outcome(server: Server, sessions: dict[str, str], seen: Seen) -> None:
    """Only truthful statuses; no turn interrupted; every accepted message once."""
    codes = {(code, reason) for _, _, code, reason in seen.calls}
    assert {code for code, _ in codes} <= {"OK", "UNAVAILABLE"}, codes
    assert {reason for code, reason in codes if code == "UNAVAILABLE"} <= {
        "AGENT_MOVING",
        "STORE_UNAVAILABLE",
    }, codes
    stored_ids: list[str] = []
    for agent_id, session_id in sessions.items():
        await wait_idle(server, agent_id, seconds=30)
        stored = await read_log(server, session_id)
        check_log(stored)
        ends = [e.turn_end for e in stored if e.HasField("turn_end")]
        assert not [end for end in ends if end.reason.HasField("interrupted")], ends
        assert not [end for end in ends if end.reason.HasField("disposed")], ends
        ids = request_ids(stored)
        assert len(ids) == len(set(ids)), ids
        stored_ids.extend(ids)
    assert set(seen.accepted) <= set(stored_ids)  # nothing accepted was lost


async def create(server: Server, agent_ids: list[str]) -> dict[str, str]:
    sessions = {}
    for agent_id in agent_ids:
        created = await server.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id=agent_id, options=sleeper(0.3)), timeout=T
        )
        sessions[agent_id] = created.agent.session_id
    return sessions


async def test_a_restarted_replica_gets_a_fair_share_back_between_turns(
    tmp_path: Path, postgres_server: str
) -> None:
    dsn = await fresh_database(postgres_server)
    agent_ids = [f"g{i}" for i in range(6)]
    async with running_server(tmp_path, config(dsn, "r0")) as r0:
        async with running_server(tmp_path, config(dsn, "r1")) as r1:
            sessions = await create(r1, agent_ids)
            await r1.crash()  # SIGKILL: r0 takes every agent over at the lease's expiry
            for _ in range(100):
                if set((await owners(dsn)).values()) == {"r0"}:
                    break
                await asyncio.sleep(0.2)
            assert set((await owners(dsn)).values()) == {"r0"}
            for agent_id in agent_ids:
                await wait_idle(r0, agent_id)
        seen = Seen()
        sending = asyncio.create_task(turns(r0, agent_ids, seen, "c"))
        try:
            await asyncio.sleep(1.0)  # turns run on r0
            async with running_server(tmp_path, config(dsn, "r1")):  # r1 is back
                spread: dict[str, int] = {}
                for _ in range(150):
                    held = list((await owners(dsn)).values())
                    spread = {name: held.count(name) for name in ("r0", "r1")}
                    if spread == {"r0": 3, "r1": 3}:
                        break
                    await asyncio.sleep(0.2)
                assert spread == {"r0": 3, "r1": 3}, spread
                await asyncio.sleep(1.0)  # turns go on on both
                sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
                await check_outcome(r0, sessions, seen)  # before r1 is killed with the test
        finally:
            sending.cancel()
        assert "handed agent" in r0.log(), r0.log()
        print(f"spread {spread}; {len(seen.calls)} calls, {len(seen.accepted)} accepted")


async def test_drain_hands_every_agent_over_between_turns_and_the_replica_exits(
    tmp_path: Path, postgres_server: str
) -> None:
    dsn = await fresh_database(postgres_server)
    async with (
        running_server(tmp_path, config(dsn, "r0")) as r0,
        running_server(tmp_path, config(dsn, "r1")) as r1,
    ):
        unknown = await run_cli(r1.address, "drain", "nobody")
        assert unknown.code != 0
        assert "NOT_FOUND" in unknown.stderr and "replica_id" in unknown.stderr, unknown.stderr
        drained = [f"d{i}" for i in range(3)]  # 3 and 2: a fair share each, nothing rebalances
        # Created in turns, so that no replica is ever above its fair share: three on r0
        # first would let r0 rebalance one to r1 before r1 had its own two.
        sessions: dict[str, str] = {}
        for server, agent_id in ((r1, "k0"), (r0, "d0"), (r1, "k1"), (r0, "d1"), (r0, "d2")):
            sessions |= await create(server, [agent_id])
        seen = Seen()
        client = connect(r1.address)
        stream = client.stream(agent_id="d0")  # through r1: forwarded to r0, its owner
        streamed: list[int] = []

        async def follow() -> None:
            async for event in stream:
                streamed.append(event.seq)  # noqa: PERF401 - as they come: it never ends

        following = asyncio.create_task(follow())
        try:
            async with load(r1, sorted(sessions), seen):  # through r1: forwarded to r0 first
                await asyncio.sleep(1.5)
                result = await run_cli(r1.address, "--json", "drain", "r0", wait=90)
                assert result.code == 0, result.stderr
                answer = json.loads(result.stdout)
                assert answer["replica_id"] == "r0"
                assert sorted(answer["agent_ids"]) == drained
                assert await r0.process.wait_exit(30) == 0  # it stops by itself
                await asyncio.sleep(1.0)  # turns go on at r1
            assert set((await owners(dsn)).values()) == {"r1"}
            await check_outcome(r1, sessions, seen)
            logged = [e.seq for e in await read_log(r1, sessions["d0"])]
            for _ in range(100):
                if len(streamed) >= len(logged):
                    break
                await asyncio.sleep(0.1)
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            stream.close()
            await client.close()
        assert stream.reconnects > 0  # the hand-over ended it; it resumed
        assert streamed == logged  # nothing lost or repeated
        assert "drained: 3 agent(s) handed over" in r0.log(), r0.log()


async def test_drain_on_a_single_server_is_refused_naming_why(e2e: E2E) -> None:
    with pytest.raises(FailedPrecondition) as refused:
        await e2e.drain()
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.reason == "NOT_REPLICATED"


async def test_sigterm_hands_every_agent_over_between_turns_before_exit(
    tmp_path: Path, postgres_server: str
) -> None:
    dsn = await fresh_database(postgres_server)
    async with (
        running_server(tmp_path, config(dsn, "r0")) as r0,
        running_server(tmp_path, config(dsn, "r1")) as r1,
    ):
        sessions = await create(r0, ["s0", "s1"])
        sessions |= await create(r1, ["s2", "s3"])
        seen = Seen()
        async with load(r1, sorted(sessions), seen):  # through r1: forwarded to r0 first
            await asyncio.sleep(1.5)
            await r0.terminate()  # SIGTERM; exit code 0 within the harness's bound
            await asyncio.sleep(1.5)  # turns go on at r1
        assert set((await owners(dsn)).values()) == {"r1"}
        await check_outcome(r1, sessions, seen)
        assert "stopping: 2 agent(s) handed over between turns" in r0.log(), r0.log()
