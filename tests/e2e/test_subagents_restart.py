"""Sub-agents across a crash: a real `python -m server` on SQLite, SIGKILLed mid-delegation.

The rule (README "Sub-agents"): children are disposed with their owner and never
resumed. After a restart no child runs; a resumed parent starts with no children and
its interrupted `delegate` call is closed with the turn (`interrupted`); the child's
session stays readable (its own open turn closed `interrupted`) and may be resumed as an
agent of its own, which then has no owner.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.subagents import (
    T,
    calling,
    children,
    get,
    says,
    scripted,
    session_events,
    turn_ends,
    until,
)
from tests.e2e.test_durability import running_server
from tests.invariants import check_log


async def test_a_crash_mid_delegation_leaves_no_child_running(tmp_path: Path) -> None:
    options = scripted(
        calling(("d1", "delegate", {"task": "slow work", "profile": "slow"})),
        says("never reached"),
        tools=("delegate",),
    )
    options.subagent_profiles["slow"].CopyFrom(scripted(says("s" * 2000, delay_ms=20)))
    async with running_server(tmp_path) as server:
        created = await server.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="boss", options=options), timeout=T
        )
        boss_session = created.agent.session_id
        await server.agents.SendMessage(
            api.SendMessageRequest(agent_id="boss", text="go"), timeout=T
        )

        async def child_streams() -> bool:
            if await children(server, "boss") != ["boss.d1"]:
                return False
            child = await get(server, "boss.d1")
            return len(await session_events(server, child.session_id)) > 8

        await until(child_streams, "the child streams its answer")
        child_session = (await get(server, "boss.d1")).session_id
        await server.crash()

    async with running_server(tmp_path) as server:
        listed = await server.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
        assert not listed.agents  # no orphan: nothing was resumed on its own
        resumed = await server.factory.ResumeAgent(
            fac.ResumeAgentRequest(agent_id="boss", session_id=boss_session), timeout=T
        )
        assert not resumed.agent.HasField("lineage")  # a resumed parent has no children
        assert await children(server, "boss") == []
        parent_events = await session_events(server, boss_session)
        assert turn_ends(parent_events) == ["interrupted"]
        kinds = [e.WhichOneof("payload") for e in parent_events]
        assert "tool_call" in kinds  # the delegate call began, and its turn was closed
        check_log(parent_events)

        child_events = await session_events(server, child_session)
        assert turn_ends(child_events) == ["interrupted"]
        check_log(child_events)
        await asyncio.sleep(0.3)  # nothing writes to it any more
        again = await session_events(server, child_session)
        assert len(again) == len(child_events)

        header = (
            await server.agents.GetSession(
                api.GetSessionRequest(session_id=child_session), timeout=T
            )
        ).session.header
        assert header.parent_agent_id == "boss"  # the record of who made it stays
        own = await server.factory.ResumeAgent(
            fac.ResumeAgentRequest(agent_id="orphan", session_id=child_session), timeout=T
        )
        assert not own.agent.HasField("lineage")  # resumed on its own: no owner
