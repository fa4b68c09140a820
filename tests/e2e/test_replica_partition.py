"""A partition between the owner and PostgreSQL: the owner stops before the survivor starts.

Two real replicas over the real embedded PostgreSQL; the owner reaches the database
through a fault proxy (`tests/faultproxy.py`), the survivor directly. With a turn
running, the proxy blackholes the owner's connections (a partition: silence, no
refusal). The owner notices its renew deadline pass and stops acting for its agents
(its log says so) before the survivor takes the agent over (the survivor's log says
when); clients of the survivor see only OK or `AGENT_MOVING`. When the partition
heals, the old owner's late statements land on a lease it no longer holds: it stops the
agent, and nothing it wrote is in the log twice or out of order.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from datetime import datetime
from pathlib import Path

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.conftest import EventStream
from tests.e2e.test_durability import T, running_server
from tests.e2e.test_replica_moves import Seen
from tests.e2e.test_replicas import LEASE, read_log, request_ids, sleeper, wait_idle
from tests.faultproxy import postgres_proxy
from tests.invariants import check_log
from tests.postgres import fresh_database


def logged_at(log: str, pattern: str) -> datetime:
    """When the first log line matching `pattern` was written."""
    for line in log.splitlines():
        if re.search(pattern, line):
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"no line matches {pattern!r}:\n{log}")


async def test_an_owner_cut_off_from_postgres_stops_before_a_survivor_takes_over(
    tmp_path: Path, postgres_server: str
) -> None:
    dsn = await fresh_database(postgres_server)
    async with postgres_proxy(dsn) as (proxy, proxied_dsn), contextlib.AsyncExitStack() as stack:
        servers = []
        for i, url in enumerate((proxied_dsn, dsn)):
            config = (
                f"agents: []\nstore: postgres\npostgresDsn: '{url}'\n"
                f"replicaId: r{i}\nleaseSeconds: {LEASE}\n"
            )
            servers.append(await stack.enter_async_context(running_server(tmp_path, config)))
        r0, r1 = servers
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="p", options=sleeper(1)), timeout=T
        )
        session_id = created.agent.session_id
        with EventStream(r1.agents, session_id=session_id) as stream:
            await r1.agents.SendMessage(
                api.SendMessageRequest(agent_id="p", text="go", request_id="go"), timeout=T
            )
            await stream.until("tool_call")  # a turn runs on r0
        proxy.blackhole()
        seen = Seen()
        try:
            for _ in range(int(4 * LEASE / 0.2)):  # through the survivor, during the partition
                await seen.call("GetAgent", r1.factory.GetAgent(
                    fac.GetAgentRequest(agent_id="p"), timeout=5))  # fmt: skip
                await asyncio.sleep(0.2)
        finally:
            proxy.heal()
        await r1.agents.SendMessage(
            api.SendMessageRequest(agent_id="p", text="after", request_id="after"), timeout=T
        )
        await wait_idle(r1, "p")
        await asyncio.sleep(2 * LEASE)  # the old owner's late statements meet the new lease

        stopped = logged_at(r0.log(), "stops acting for its agents")
        taken = logged_at(r1.log(), "taking over agent p")
        assert stopped < taken, (stopped, taken)  # the owner stopped first
        codes = {(code, reason) for _, _, code, reason in seen.calls}
        assert codes <= {("OK", ""), ("UNAVAILABLE", "AGENT_MOVING")}, codes
        assert ("OK", "") in codes  # the survivor answers for the agent itself
        stored = await read_log(r1, session_id)
        check_log(stored)
        assert request_ids(stored) == ["go", "after"]
        turns = [e.turn_start.turn for e in stored if e.HasField("turn_start")]
        assert turns == sorted(set(turns))
        assert "was lost" in r0.log() or "another writer" in r0.log(), r0.log()
