"""The `delegate` and `collect` tools through a real server, driven by scripted models.

Foreground: the call's result is the child's final answer, with a pointer to its
session in the result's meta. Background: the call returns the child's id; `collect`
returns its answer in a later turn. A child's approval is listed on its parent and
answered there.
"""

from __future__ import annotations

import sys

import grpc
from google.protobuf import json_format

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import approval_pb2
from agentloop.v1 import session_event_pb2 as ev
from tests.e2e.conftest import E2E, EventStream, text_of
from tests.e2e.registry import register
from tests.e2e.subagents import (
    T,
    calling,
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
from tests.e2e.test_approvals import readme_block, run_script
from tests.invariants import check_log
from tests.processes import REPO, PluginLauncher, node

TOOLS = ("delegate", "collect", "word_count")


def results(events: list[ev.SessionEvent]) -> list[ev.ToolResult]:
    return [e.tool_result for e in events if e.HasField("tool_result")]


def meta(result: ev.ToolResult) -> dict[str, object]:
    return json_format.MessageToDict(result.meta)


async def test_two_foreground_children_in_one_step_answer_in_model_order(e2e: E2E) -> None:
    options = scripted(
        calling(
            ("d1", "delegate", {"task": "first", "mode": "foreground", "profile": "slow"}),
            ("d2", "delegate", {"task": "second", "profile": "quick"}),
        ),
        says("both done"),
        tools=TOOLS,
    )
    options.subagent_profiles["slow"].CopyFrom(scripted(says("alpha answer", delay_ms=40)))
    options.subagent_profiles["quick"].CopyFrom(scripted(says("beta", delay_ms=40)))
    await create(e2e, "boss", options)
    with EventStream(e2e.agents, agent_id="boss") as stream:
        await send(e2e, "boss", "split the work")

        async def both_live() -> bool:
            return await children(e2e, "boss") == ["boss.d1", "boss.d2"]

        await until(both_live, "both children run at once")
        await stream.until("turn_end")
    await wait_idle(e2e, "boss")
    # The parent's live events showed each child's step and its end as they happened.
    progress = [e.child_progress for e in stream.agent_events if e.HasField("child_progress")]
    for child_id, call_id, text in (("boss.d1", "d1", "alpha answer"), ("boss.d2", "d2", "beta")):
        mine = [(p.state, p.step, p.text) for p in progress if p.child_agent_id == child_id]
        assert mine == [("running", 1, text), ("completed", 0, text)]
        assert {p.tool_call_id for p in progress if p.child_agent_id == child_id} == {call_id}
    ends = [p.child_agent_id for p in progress if p.state == "completed"]
    assert ends == ["boss.d2", "boss.d1"]  # the quick child ended first
    session = (await get(e2e, "boss")).session_id
    events = await session_events(e2e, session)
    assert turn_ends(events) == ["completed"]
    first, second = results(events)
    assert (first.call_id, second.call_id) == ("d1", "d2")  # model order; d2 ended first
    assert (text_of(first.content), text_of(second.content)) == ("alpha answer", "beta")
    for result, child_id in ((first, "boss.d1"), (second, "boss.d2")):
        info = meta(result)
        assert info["agent_id"] == child_id and info["state"] == "completed"
        child_session = str(info["session_id"])
        child_events = await session_events(e2e, child_session)
        assert turn_ends(child_events) == ["completed"]  # the child's session, whole
        check_log(child_events)
        got = await e2e.agents.GetSession(
            api.GetSessionRequest(session_id=child_session), timeout=T
        )
        header = got.session.header
        assert (header.parent_agent_id, header.parent_tool_call_id) == ("boss", result.call_id)
    assert await children(e2e, "boss") == []  # a foreground child is disposed once it answered
    check_log(events)


async def test_a_child_without_profile_has_the_parents_tools_less_delegation(e2e: E2E) -> None:
    options = scripted(calling(("d1", "delegate", {"task": "three words here"})), tools=TOOLS)
    await create(e2e, "boss", options)
    await send(e2e, "boss")
    await wait_idle(e2e, "boss")
    (result,) = results(await session_events(e2e, (await get(e2e, "boss")).session_id))
    # The parent's provider without its script: the default behaviour counts the words
    # with the `word_count` tool it inherited (and it was offered no `delegate`).
    assert text_of(result.content) == "Tool results: 3 words"
    child_events = await session_events(e2e, str(meta(result)["session_id"]))
    (request,) = [e for e in child_events if e.HasField("request_header")]
    offered = sorted(t.name for t in request.request_header.header.tools)
    assert offered == ["word_count"]


async def test_a_background_child_is_collected_in_a_later_turn(e2e: E2E) -> None:
    worker = scripted(says("the long answer", delay_ms=5))
    options = scripted(
        calling(("bg", "delegate", {"task": "work", "mode": "background", "profile": "worker"})),
        says("started it"),
        calling(("c1", "collect", {"agent_id": "boss.bg"})),
        says("collected"),
        tools=TOOLS,
    )
    options.subagent_profiles["worker"].CopyFrom(worker)
    await create(e2e, "boss", options)
    await send(e2e, "boss", "turn one")
    await wait_idle(e2e, "boss")
    assert await children(e2e, "boss") == ["boss.bg"]
    child = await get(e2e, "boss.bg")
    assert child.lineage.parent_tool_call_id == "bg"
    await send(e2e, "boss", "turn two")
    await wait_idle(e2e, "boss")
    events = await session_events(e2e, (await get(e2e, "boss")).session_id)
    assert turn_ends(events) == ["completed", "completed"]
    started, collected = results(events)
    assert "boss.bg" in text_of(started.content) and meta(started)["state"] == "running"
    assert text_of(collected.content) == "the long answer"
    assert (
        meta(collected)["state"] == "completed"
        and meta(collected)["session_id"] == child.session_id
    )
    assert await children(e2e, "boss") == []


async def test_collect_refuses_an_agent_that_is_not_a_child(e2e: E2E) -> None:
    await create(e2e, "stranger")
    options = scripted(
        calling(("c1", "collect", {"agent_id": "stranger"})), says("ok"), tools=TOOLS
    )
    await create(e2e, "boss", options)
    await send(e2e, "boss")
    await wait_idle(e2e, "boss")
    (result,) = results(await session_events(e2e, (await get(e2e, "boss")).session_id))
    assert result.is_error and "not a live sub-agent" in text_of(result.content)
    assert (await get(e2e, "stranger")).agent_id == "stranger"  # untouched


async def test_cancelling_the_parent_cancels_a_foreground_child(e2e: E2E) -> None:
    options = scripted(
        calling(("d1", "delegate", {"task": "slow", "profile": "slow"})), says("never"), tools=TOOLS
    )
    options.subagent_profiles["slow"].CopyFrom(scripted(says("z" * 500, delay_ms=20)))
    await create(e2e, "boss", options)
    await send(e2e, "boss")

    async def child_runs() -> bool:
        return await children(e2e, "boss") == ["boss.d1"]

    await until(child_runs, "the child runs")
    child_session = (await get(e2e, "boss.d1")).session_id
    await e2e.agents.CancelTurn(api.CancelTurnRequest(agent_id="boss", reason="enough"), timeout=T)
    await wait_idle(e2e, "boss")
    assert turn_ends(await session_events(e2e, (await get(e2e, "boss")).session_id)) == ["aborted"]
    assert turn_ends(await session_events(e2e, child_session)) in (["aborted"], ["disposed"])
    code, info, _ = await refused(get(e2e, "boss.d1"))
    assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_DISPOSED")


async def test_a_childs_approval_is_answered_on_its_parent(e2e: E2E) -> None:
    careful = scripted(
        calling(("w1", "word_count", {"text": "a b c d"})), says("counted"), tools=("word_count",)
    )
    careful.approval_required_tools.append("word_count")
    options = scripted(
        calling(("d1", "delegate", {"task": "count", "profile": "careful"})),
        says("done"),
        tools=TOOLS,
    )
    options.subagent_profiles["careful"].CopyFrom(careful)
    await create(e2e, "boss", options)
    await send(e2e, "boss")

    async def pending() -> bool:
        listed = await e2e.agents.ListApprovals(
            api.ListApprovalsRequest(agent_id="boss", include_children=True), timeout=T
        )
        return bool(listed.approvals)

    await until(pending, "the child asks")
    own = await e2e.agents.ListApprovals(api.ListApprovalsRequest(agent_id="boss"), timeout=T)
    assert not own.approvals  # without include_children: only the parent's own
    listed = await e2e.agents.ListApprovals(
        api.ListApprovalsRequest(agent_id="boss", include_children=True), timeout=T
    )
    (approval,) = listed.approvals
    assert (approval.agent_id, approval.tool_name, approval.call_id) == (
        "boss.d1",
        "word_count",
        "w1",
    )
    answer = await e2e.agents.ResolveApproval(
        api.ResolveApprovalRequest(
            agent_id="boss",  # the parent's id reaches the child that waits
            approval_id=approval.approval_id,
            decision=approval_pb2.APPROVAL_DECISION_ALLOW_ONCE,
        ),
        timeout=T,
    )
    assert answer.resolution.outcome == approval_pb2.APPROVAL_OUTCOME_ALLOWED_ONCE
    await wait_idle(e2e, "boss")
    events = await session_events(e2e, (await get(e2e, "boss")).session_id)
    (result,) = results(events)
    assert text_of(result.content) == "counted" and not result.is_error
    child_events = await session_events(e2e, str(meta(result)["session_id"]))
    (counted,) = results(child_events)
    assert text_of(counted.content) == "4 words"


async def test_a_profile_the_parent_lacks_is_a_tool_error(e2e: E2E) -> None:
    options = scripted(
        calling(("d1", "delegate", {"task": "x", "profile": "nope"})), says("ok"), tools=TOOLS
    )
    await create(e2e, "boss", options)
    await send(e2e, "boss")
    await wait_idle(e2e, "boss")
    (result,) = results(await session_events(e2e, (await get(e2e, "boss")).session_id))
    assert result.is_error and 'unknown profile "nope"' in text_of(result.content)


async def test_a_bad_profile_is_refused_at_creation_naming_it(e2e: E2E) -> None:
    options = scripted(tools=TOOLS)
    options.subagent_profiles["helper"].CopyFrom(scripted(tools=("no_such_tool",)))
    code, _, field = await refused(create(e2e, "boss", options))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert field == "options.subagent_profiles[helper].tools"


async def test_collect_without_waiting_shows_progress_then_the_answer(e2e: E2E) -> None:
    options = scripted(
        calling(("bg", "delegate", {"task": "work", "mode": "background", "profile": "slow"})),
        says("started"),
        calling(("peek", "collect", {"agent_id": "boss.bg", "wait": False})),
        says("peeked"),
        calling(("take", "collect", {"agent_id": "boss.bg"})),
        says("taken"),
        tools=TOOLS,
    )
    options.subagent_profiles["slow"].CopyFrom(scripted(says("w" * 60, delay_ms=40)))
    await create(e2e, "boss", options)
    for text in ("one", "two", "three"):
        await send(e2e, "boss", text)
        await wait_idle(e2e, "boss")
    events = await session_events(e2e, (await get(e2e, "boss")).session_id)
    _, peek, take = results(events)
    assert "still running" in text_of(peek.content) and meta(peek)["state"] == "running"
    assert text_of(take.content) == "w" * 60 and meta(take)["state"] == "completed"
    assert await children(e2e, "boss") == []


async def test_the_readme_team_runs_as_written(e2e: E2E) -> None:
    output = await run_script(readme_block("# A team with grpcurl"), e2e.target)
    sessions = (await e2e.agents.ListSessions(api.ListSessionsRequest(), timeout=T)).sessions
    (lead_session,) = [s.session_id for s in sessions if s.session_id.startswith("lead-session-")]
    events = await session_events(e2e, lead_session)
    assert turn_ends(events) == ["completed"]
    first, second, collected = results(events)
    assert text_of(first.content) == "You said: count me"
    assert "lead.b" in text_of(second.content)
    assert text_of(collected.content) == "You said: and me"
    assert "You said: count me" in output  # the grep of the tool results
    # The hand-made, seeded child was listed under the lead, then disposed with it.
    assert '"agent_id": "helper"' in output
    code, info, _ = await refused(get(e2e, "helper"))
    assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_DISPOSED")
    (seeded,) = [s for s in sessions if s.session_id.startswith("helper-session-")]
    assert seeded.header.parent_agent_id == "lead"
    assert seeded.header.parent_session_id == lead_session
    assert seeded.header.seed_length == len(events)


async def test_a_python_plugin_builds_a_child_over_the_plain_api(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(
        [
            sys.executable,
            str(REPO / "clients/python/examples/team_plugin.py"),
            "--server",
            e2e.target,
        ]
    )
    await register(e2e.channel, plugin.address)
    options = scripted(
        calling(("t1", "ask_team", {"task": "hello team"})), says("thanks"), tools=("ask_team",)
    )
    await create(e2e, "boss", options)
    await send(e2e, "boss")
    await wait_idle(e2e, "boss")
    (result,) = results(await session_events(e2e, (await get(e2e, "boss")).session_id))
    assert text_of(result.content) == "boss.team-t1 answered: You said: hello team"
    sessions = (await e2e.agents.ListSessions(api.ListSessionsRequest(), timeout=T)).sessions
    (child,) = [s for s in sessions if s.session_id.startswith("boss.team-t1-session-")]
    assert (child.header.parent_agent_id, child.header.parent_tool_call_id) == ("boss", "t1")
    assert await children(e2e, "boss") == []  # the plugin disposed it


async def test_a_node_plugin_builds_children_follows_them_and_collects_them(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(
        [node(), str(REPO / "clients/node/examples/team-plugin.js"), "--server", e2e.target]
    )
    await register(e2e.channel, plugin.address)
    options = scripted(
        calling(
            ("t1", "ask_team", {"task": "hello team"}),
            ("t2", "ask_team", {"task": "later please", "background": True}),
        ),
        calling(("c2", "collect_team", {"agent_id": "boss.team-t2"})),
        says("thanks"),
        tools=("ask_team", "collect_team"),
    )
    await create(e2e, "boss", options)
    await send(e2e, "boss")
    await wait_idle(e2e, "boss")
    by_call = {
        r.call_id: r
        for r in results(await session_events(e2e, (await get(e2e, "boss")).session_id))
    }
    assert text_of(by_call["t1"].content) == "boss.team-t1 answered: You said: hello team"
    assert text_of(by_call["t2"].content) == ("started boss.team-t2; collect it with collect_team")
    assert text_of(by_call["c2"].content) == "boss.team-t2 answered: You said: later please"
    assert not any(r.is_error for r in by_call.values())
    # The plugin followed each child's session: its step, then its end.
    printed = {await plugin.line() for _ in range(4)}
    assert printed == {
        "boss.team-t1 step 1",
        "boss.team-t1 completed after 1 step(s)",
        "boss.team-t2 step 1",
        "boss.team-t2 completed after 1 step(s)",
    }
    sessions = (await e2e.agents.ListSessions(api.ListSessionsRequest(), timeout=T)).sessions
    for call_id in ("t1", "t2"):
        (child,) = [s for s in sessions if s.session_id.startswith(f"boss.team-{call_id}-session-")]
        assert (child.header.parent_agent_id, child.header.parent_tool_call_id) == ("boss", call_id)
        check_log(await session_events(e2e, child.session_id))
    assert await children(e2e, "boss") == []  # collected children are disposed


async def test_disposing_the_parent_mid_delegation_disposes_the_child(e2e: E2E) -> None:
    options = scripted(
        calling(("d1", "delegate", {"task": "slow", "profile": "slow"})), says("never"), tools=TOOLS
    )
    options.subagent_profiles["slow"].CopyFrom(scripted(says("z" * 500, delay_ms=20)))
    boss = await create(e2e, "boss", options)
    await send(e2e, "boss")

    async def child_runs() -> bool:
        return await children(e2e, "boss") == ["boss.d1"]

    await until(child_runs, "the child runs")
    child_session = (await get(e2e, "boss.d1")).session_id
    await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="boss"), timeout=T)
    assert turn_ends(await session_events(e2e, child_session)) == ["disposed"]
    assert turn_ends(await session_events(e2e, boss.session_id)) == ["disposed"]
    for agent_id in ("boss", "boss.d1"):
        code, info, _ = await refused(get(e2e, agent_id))
        assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_DISPOSED")
