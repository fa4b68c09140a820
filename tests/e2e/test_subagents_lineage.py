"""Sub-agents through a real server: lineage in the contract, seeds, owned teardown, limits.

A child is created with a `parent` (and optionally a `seed`); `Agent.lineage`, the
`ListAgents` parent filter and the child's session header show it; disposing the parent
disposes the tree depth first; cancelling the parent's turn cancels the children it made.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from agentloop.v1 import agent_event_pb2
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from server.kernel.limits import Limits
from server.settings.config import Config
from tests.e2e.conftest import E2E, running_app
from tests.e2e.subagents import (
    T,
    children,
    create,
    get,
    refused,
    says,
    scripted,
    send,
    session_events,
    turn_ends,
    until,
    wait_idle,
)
from tests.invariants import check_log

RUNNING = agent_event_pb2.AGENT_STATUS_RUNNING


async def test_a_child_shows_its_parent_everywhere(e2e: E2E) -> None:
    await create(e2e, "p")
    child = await create(e2e, "p.c1", parent="p", call="call-7")
    assert (child.lineage.parent_agent_id, child.lineage.parent_tool_call_id) == ("p", "call-7")
    assert child.lineage.depth == 1
    grandchild = await create(e2e, "p.c1.g", parent="p.c1")
    assert grandchild.lineage.depth == 2
    await create(e2e, "other")

    parent = await get(e2e, "p")
    assert not parent.lineage.parent_agent_id and list(parent.lineage.child_agent_ids) == ["p.c1"]
    assert list((await get(e2e, "p.c1")).lineage.child_agent_ids) == ["p.c1.g"]
    assert not (await get(e2e, "other")).HasField("lineage")
    assert await children(e2e, "p") == ["p.c1"]
    assert await children(e2e, "p.c1") == ["p.c1.g"]
    assert await children(e2e, "other") == []

    session = await e2e.agents.GetSession(
        api.GetSessionRequest(session_id=child.session_id), timeout=T
    )
    header = session.session.header
    assert (header.parent_agent_id, header.parent_tool_call_id) == ("p", "call-7")


async def test_a_bad_parent_or_seed_is_refused_naming_the_field(e2e: E2E) -> None:
    await create(e2e, "p")
    code, info, _ = await refused(create(e2e, "c", parent="ghost"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert info.metadata["field"] == "parent.agent_id" and info.metadata["agent_id"] == "ghost"
    code, _, field = await refused(create(e2e, "c", parent="bad id!"))
    assert (code, field) == (grpc.StatusCode.INVALID_ARGUMENT, "parent.agent_id")
    code, _, field = await refused(create(e2e, "c", parent="p", call="x" * 257))
    assert (code, field) == (grpc.StatusCode.INVALID_ARGUMENT, "parent.tool_call_id")

    code, info, _ = await refused(create(e2e, "c", seed=fac.SessionSeed(session_id="nowhere")))
    assert code == grpc.StatusCode.NOT_FOUND and info.metadata["field"] == "seed.session_id"
    await send(e2e, "p")
    await wait_idle(e2e, "p")
    source = (await get(e2e, "p")).session_id
    code, _, field = await refused(create(e2e, "c", seed=fac.SessionSeed(session_id=source, seq=1)))
    assert (code, field) == (grpc.StatusCode.INVALID_ARGUMENT, "seed.seq")
    code, _, field = await refused(
        create(e2e, "c", seed=fac.SessionSeed(session_id=source, seq=10_000))
    )
    assert (code, field) == (grpc.StatusCode.INVALID_ARGUMENT, "seed.seq")
    assert await children(e2e, "p") == []  # nothing was created
    listed = await e2e.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
    assert [a.agent_id for a in listed.agents] == ["p"]


async def test_a_seeded_child_starts_from_the_seed_boundary(e2e: E2E) -> None:
    await create(e2e, "p", scripted(says("first answer"), says("second answer")))
    await send(e2e, "p", "one")
    await wait_idle(e2e, "p")
    parent_session = (await get(e2e, "p")).session_id
    first_turn = await session_events(e2e, parent_session)
    boundary = first_turn[-1].seq
    await send(e2e, "p", "two")
    await wait_idle(e2e, "p")

    child = await create(
        e2e, "p.c", parent="p", seed=fac.SessionSeed(session_id=parent_session, seq=boundary)
    )
    events = await session_events(e2e, child.session_id)
    assert [e.SerializeToString() for e in events[: len(first_turn)]] == [
        e.SerializeToString() for e in first_turn
    ]
    header = (
        await e2e.agents.GetSession(api.GetSessionRequest(session_id=child.session_id), timeout=T)
    ).session.header
    assert header.parent_session_id == parent_session and header.seed_length == len(first_turn)
    assert header.parent_agent_id == "p"

    await send(e2e, "p.c", "three")  # the child continues after the seed, on its own
    await wait_idle(e2e, "p.c")
    after = await session_events(e2e, child.session_id)
    assert turn_ends(after) == ["completed", "completed"]
    assert after[len(first_turn)].turn_start.turn == 2  # numbering continues the seed's
    check_log(after)


async def test_disposing_the_parent_disposes_the_tree_depth_first(e2e: E2E) -> None:
    slow = scripted(says("x" * 400, delay_ms=20))
    await create(e2e, "p")
    await create(e2e, "p.a", slow, parent="p")
    await create(e2e, "p.a.x", slow, parent="p.a")
    await create(e2e, "p.b", parent="p")
    await send(e2e, "p.a.x")
    await send(e2e, "p.a")

    async def running() -> bool:
        return (await get(e2e, "p.a.x")).status == RUNNING

    await until(running, "the grandchild runs")
    sessions = {a: (await get(e2e, a)).session_id for a in ("p.a", "p.a.x", "p.b")}
    disposed = await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="p"), timeout=T)
    assert sorted(disposed.agent.lineage.child_agent_ids) == ["p.a", "p.b"]
    for agent_id in ("p", "p.a", "p.a.x", "p.b"):
        code, info, _ = await refused(get(e2e, agent_id))
        assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_DISPOSED")
    for agent_id in ("p.a", "p.a.x"):  # their running turns ended `disposed`
        assert turn_ends(await session_events(e2e, sessions[agent_id])) == ["disposed"]
    listed = await e2e.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
    assert not listed.agents


async def test_cancelling_the_parents_turn_cancels_the_children_it_made(e2e: E2E) -> None:
    slow = scripted(says("y" * 400, delay_ms=20))
    await create(e2e, "p", scripted(says("z" * 400, delay_ms=20)))
    await create(e2e, "before", slow, parent="p")  # made outside any turn of p
    await send(e2e, "p")
    await send(e2e, "before")

    async def running() -> bool:
        return (await get(e2e, "p")).status == RUNNING

    await until(running, "the parent runs")
    await create(e2e, "during", slow, parent="p")  # made while p's turn 1 runs
    await send(e2e, "during")
    await e2e.agents.CancelTurn(api.CancelTurnRequest(agent_id="p", reason="stop"), timeout=T)
    await wait_idle(e2e, "during")
    during = await get(e2e, "during")
    assert turn_ends(await session_events(e2e, during.session_id)) == ["aborted"]
    before = await get(e2e, "before")
    assert before.status == RUNNING  # not p's turn's child: it runs on
    await wait_idle(e2e, "before")
    assert turn_ends(await session_events(e2e, before.session_id)) == ["completed"]


async def test_depth_and_fan_out_are_bounded(tmp_path: Path) -> None:
    config = Config(
        listen="127.0.0.1:0", store="memory", agents=(),
        limits=Limits(max_agent_depth=2, max_children_per_agent=2),
    )  # fmt: skip
    async with running_app(config) as e2e:
        await create(e2e, "p")
        await create(e2e, "c1", parent="p")
        await create(e2e, "c2", parent="p")
        code, info, _ = await refused(create(e2e, "c3", parent="p"))
        assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LINEAGE_LIMIT")
        await create(e2e, "g", parent="c1")
        code, info, _ = await refused(create(e2e, "gg", parent="g"))
        assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LINEAGE_LIMIT")
        await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="c2"), timeout=T)
        await create(e2e, "c3", parent="p")  # a disposed child frees its place
        assert await children(e2e, "p") == ["c1", "c3"]
