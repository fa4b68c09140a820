"""Sub-agents on replicas: two real server processes over the embedded PostgreSQL.

The tree lives with the parent: a `CreateAgent` naming a parent, and a `ListAgents` of
a parent's children, go to the parent's owner from any replica, so the parent's
`collect` and its teardown reach the child. A parent between owners is `UNAVAILABLE`
(`AGENT_MOVING`), never a misleading `NOT_FOUND`; an unknown parent is `NOT_FOUND`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.subagents import T, calling, children, get, refused, says, scripted
from tests.e2e.test_durability import Server, running_server
from tests.e2e.test_replica_outage import refusal
from tests.e2e.test_replicas import owned_again, read_log, wait_idle
from tests.invariants import check_log
from tests.postgres import fresh_database

LEASE = 4
"""Seconds a dead replica's agents stay its own: the window a moving parent is refused."""


@contextlib.asynccontextmanager
async def two_replicas(tmp_path: Path, postgres_server: str) -> AsyncIterator[list[Server]]:
    dsn = await fresh_database(postgres_server)
    async with contextlib.AsyncExitStack() as stack:
        servers = []
        for i in range(2):
            config = (
                f"agents: []\nstore: postgres\npostgresDsn: '{dsn}'\n"
                f"replicaId: r{i}\nleaseSeconds: {LEASE}\n"
            )
            servers.append(await stack.enter_async_context(running_server(tmp_path, config)))
        yield servers


async def child_of(server: Server, parent: str, agent_id: str) -> fac.CreateAgentResponse:
    return await server.factory.CreateAgent(
        fac.CreateAgentRequest(
            agent_id=agent_id,
            options=scripted(says(f"{agent_id} done")),
            parent=fac.AgentParent(agent_id=parent, tool_call_id="by-hand"),
        ),
        timeout=T,
    )


async def test_a_child_asked_for_on_another_replica_lives_with_its_parent(
    tmp_path: Path, postgres_server: str
) -> None:
    async with two_replicas(tmp_path, postgres_server) as (r0, r1):
        lead = scripted(
            calling(("c1", "collect", {"agent_id": "lead.helper"})),
            says("collected"),
            tools=("delegate", "collect"),
        )
        await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="lead", options=lead), timeout=T
        )
        # Asked of r1, made on r0 beside its parent.
        created = await child_of(r1, "lead", "lead.helper")
        assert created.agent.lineage.parent_agent_id == "lead"
        assert list((await get(r1, "lead")).lineage.child_agent_ids) == ["lead.helper"]
        assert await children(r1, "lead") == ["lead.helper"]
        assert await children(r0, "lead") == ["lead.helper"]
        await r1.agents.SendMessage(
            api.SendMessageRequest(agent_id="lead.helper", text="help"), timeout=T
        )
        await wait_idle(r1, "lead.helper")
        # The parent's collect (on r0) takes the child's answer and disposes it.
        await r1.agents.SendMessage(api.SendMessageRequest(agent_id="lead", text="go"), timeout=T)
        await wait_idle(r1, "lead")
        log = await read_log(r1, created.agent.session_id)
        check_log(log)
        lead_log = await read_log(r1, (await get(r1, "lead")).session_id)
        (result,) = [e.tool_result for e in lead_log if e.HasField("tool_result")]
        assert not result.is_error
        assert result.content[0].text.text == "lead.helper done"
        assert await children(r1, "lead") == []
        # Teardown from the other replica: disposing the parent disposes its child.
        second = await child_of(r1, "lead", "lead.second")
        await r1.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="lead"), timeout=T)
        code, info, _ = await refused(get(r0, "lead.second"))
        assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_DISPOSED")
        listed = await r1.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
        assert [a.agent_id for a in listed.agents] == []  # every replica's agents, merged
        check_log(await read_log(r1, second.agent.session_id))
        # A parent no replica runs is NOT_FOUND, naming the field.
        code, info, _ = await refused(child_of(r1, "nobody", "nobody.child"))
        assert (code, info.reason) == (grpc.StatusCode.NOT_FOUND, "AGENT_NOT_FOUND")
        assert info.metadata["field"] == "parent.agent_id"


async def test_a_child_of_a_parent_between_owners_is_refused_as_moving(
    tmp_path: Path, postgres_server: str
) -> None:
    async with two_replicas(tmp_path, postgres_server) as (r0, r1):
        await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="lead", options=scripted()), timeout=T
        )
        await r0.process.kill()  # its lease holds for LEASE seconds: the parent is moving
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await child_of(r1, "lead", "lead.early")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        reason, retry = refusal(caught.value)
        assert reason == "AGENT_MOVING" and retry > 0
        # Once r1 took the parent over, its children are made there.
        await owned_again(r1, "lead", seconds=LEASE * 4)
        created = await child_of(r1, "lead", "lead.late")
        assert created.agent.lineage.parent_agent_id == "lead"
        assert await children(r1, "lead") == ["lead.late"]
