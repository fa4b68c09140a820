"""A replica that stalls past its lease while nobody takes its agents over keeps them.

A real `python -m server` over a real embedded PostgreSQL, paused (SIGSTOP) for longer
than its lease with a turn running and a message accepted and queued: no other replica
took the agent, so when the process wakes the agent is still its own, the running
turn ends and the queued message runs, once. (Losing the agent there would leave
the accepted message pending in the store with nobody to run it.)
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.conftest import EventStream
from tests.e2e.test_durability import T, running_server
from tests.e2e.test_replicas import LEASE, read_log, request_ids, sleeper, wait_idle
from tests.invariants import check_log
from tests.postgres import fresh_database


async def test_a_replica_paused_past_its_lease_keeps_its_agent_and_runs_what_it_accepted(
    tmp_path: Path, postgres_server: str
) -> None:
    dsn = await fresh_database(postgres_server)
    config = (
        f"agents: []\nstore: postgres\npostgresDsn: '{dsn}'\nreplicaId: r0\nleaseSeconds: {LEASE}\n"
    )
    async with running_server(tmp_path, config) as r0:
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="p", options=sleeper(1)), timeout=T
        )
        session_id = created.agent.session_id
        with EventStream(r0.agents, session_id=session_id) as stream:
            await r0.agents.SendMessage(
                api.SendMessageRequest(agent_id="p", text="first", request_id="first"), timeout=T
            )
            await stream.until("tool_call")  # turn 1 sleeps
        await r0.agents.SendMessage(
            api.SendMessageRequest(agent_id="p", text="second", request_id="second"), timeout=T
        )  # accepted: queued behind turn 1, pending in the store
        pid = r0.process.process.pid
        os.kill(pid, signal.SIGSTOP)  # a stall past the lease; nobody else takes it
        try:
            await asyncio.sleep(3 * LEASE)
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_idle(r0, "p")  # still its agent: not disposed, not lost
        got = await r0.factory.GetAgent(fac.GetAgentRequest(agent_id="p"), timeout=T)
        assert got.agent.session_id == session_id
        stored = await read_log(r0, session_id)
        check_log(stored)
        assert request_ids(stored) == ["first", "second"]  # the queued one ran, once
        assert "was lost" not in r0.log(), r0.log()
        await r0.terminate()
