"""Agent lifecycle: creation transaction, resume, disposal, verbs after disposal, whenIdle."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_pb2
from agentloop.v1 import decision_pb2 as d
from server.kernel import seams as S
from server.kernel.errors import AgentDisposed, AlreadyExists, FailedPrecondition, InvalidArgument
from server.models.scripted_options import script_options
from tests.harness import Harness, kinds, reason_kinds, text_block, text_step, turn_ends


async def test_session_id_defaults_to_agent_session_uuid(harness: Harness) -> None:
    agent = await harness.create("cfg")
    assert re.fullmatch(r"cfg-session-[0-9a-f-]{36}", agent.session.session_id)
    other = await harness.create("prog", session_id="chosen-id")
    assert other.session.session_id == "chosen-id"


async def test_invalid_ids_name_the_field(harness: Harness) -> None:
    with pytest.raises(InvalidArgument, match="^agent_id:"):
        await harness.create("")
    with pytest.raises(InvalidArgument, match="^agent_id:"):
        await harness.create("has space")
    with pytest.raises(InvalidArgument, match="^session_id:"):
        await harness.create("ok", session_id="bad/id")
    with pytest.raises(InvalidArgument, match="^metadata.cwd:"):
        await harness.create("ok", cwd="relative/path")
    with pytest.raises(InvalidArgument, match="^options.max_parallel_tool_calls:"):
        await harness.create("ok", max_parallel_tool_calls=0)
    assert harness.factory.agents == {}


async def test_duplicate_agent_id_is_rejected_without_an_orphaned_session(
    harness: Harness,
) -> None:
    await harness.create("dup", session_id="s1")
    with pytest.raises(AlreadyExists):
        await harness.create("dup", session_id="s2")
    assert not await harness.runtime.store.exists("s2")
    assert set(harness.factory.sessions) == {"s1"}


async def test_concurrent_same_id_creation_has_one_winner(harness: Harness) -> None:
    gate = asyncio.Event()

    async def slow_setup(agent: Any) -> None:
        await gate.wait()

    first = asyncio.ensure_future(harness.create("race", session_id="r1", setup=slow_setup))
    second = asyncio.ensure_future(harness.create("race", session_id="r2", setup=slow_setup))
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(first, second, return_exceptions=True)
    winners = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, AlreadyExists)]
    assert len(winners) == 1 and len(losers) == 1
    assert list(harness.factory.sessions) == [winners[0].session.session_id]
    assert await harness.runtime.store.list_ids() == [winners[0].session.session_id]


async def test_setup_rejection_publishes_nothing(harness: Harness) -> None:
    created: list[Any] = []
    harness.runtime.seams.on(S.SESSION_START, lambda started: created.append(started.agent))

    async def failing_setup(agent: Any) -> None:
        harness.runtime.seams.on(
            S.PROMPT_SUBMIT, lambda call, next_: next_(), agent_id=agent.agent_id
        )
        raise RuntimeError("setup failed")

    with pytest.raises(RuntimeError, match="setup failed"):
        await harness.create("s", setup=failing_setup)
    assert created == [] and harness.factory.agents == {}
    assert harness.runtime.seams.listeners(S.PROMPT_SUBMIT, "s") == []
    await harness.create("s")  # the id is free again


async def test_a_throwing_created_listener_vetoes_publication(harness: Harness) -> None:
    def veto(agent: Any) -> None:
        raise RuntimeError("not this one")

    dispose = harness.runtime.seams.on(S.CREATED, veto)
    with pytest.raises(RuntimeError, match="not this one"):
        await harness.create("v", session_id="vs")
    assert "v" not in harness.factory.agents and "vs" not in harness.factory.sessions
    dispose()
    await harness.create("v", session_id="vs2")


async def test_lifecycle_events_in_order(harness: Harness) -> None:
    order: list[str] = []
    harness.runtime.seams.on(S.CREATED, lambda agent: order.append("created"))
    harness.runtime.seams.on(S.SESSION_START, lambda started: order.append("session-start"))
    harness.runtime.seams.on(S.DISPOSED, lambda agent: order.append("disposed"))

    async def setup(agent: Any) -> None:
        order.append("setup")

    await harness.create("l", setup=setup)
    await harness.factory.dispose("l")
    assert order == ["setup", "created", "session-start", "disposed"]


async def test_verbs_after_disposal_raise(harness: Harness) -> None:
    agent = await harness.create()
    await harness.factory.dispose("a1")
    with pytest.raises(AgentDisposed, match='agent "a1" is disposed'):
        agent.send([text_block("x")])
    with pytest.raises(AgentDisposed):
        agent.steer([text_block("x")])
    with pytest.raises(AgentDisposed):
        agent.inject(d.HookContext(content=[text_block("x")]))
    await asyncio.wait_for(agent.when_idle(), 5)  # resolves at once for a disposed agent
    await harness.factory.teardown(agent)  # idempotent
    assert harness.status_traces["a1"] == [ae.AGENT_STATUS_DISPOSED]


async def test_scoped_listeners_die_with_their_agent(harness: Harness) -> None:
    seen: list[str] = []

    async def setup(agent: Any) -> None:
        harness.runtime.seams.on(
            S.PRE_STEP, lambda call: seen.append(call.agent_id), agent_id=agent.agent_id
        )

    one = await harness.create("one", script=[text_step("x")], setup=setup)
    two = await harness.create("two", script=[text_step("x")])
    await harness.turn(one, "hi")
    await harness.turn(two, "hi")
    assert seen == ["one"]
    await harness.factory.dispose("one")
    assert harness.runtime.seams.listeners(S.PRE_STEP, "one") == []


async def test_when_idle_waits_for_queued_work(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    await asyncio.wait_for(agent.when_idle(), 1)  # idle at once
    agent.send([text_block("a")])
    waiter = asyncio.ensure_future(agent.when_idle())
    log_when_idle: list[list[str]] = []
    waiter.add_done_callback(lambda _: log_when_idle.append(reason_kinds(agent)))
    await asyncio.wait_for(waiter, 5)
    assert log_when_idle == [["completed"]]  # it resolved after the turn, not before


async def test_when_idle_resolves_when_a_cancel_drops_the_queued_turn(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("x")])
    agent.send([text_block("a")])
    waiter = asyncio.ensure_future(agent.when_idle())
    assert agent.cancel("never mind") == (True, 1)  # before the driver woke: no step runs
    await asyncio.wait_for(waiter, 5)
    # The accepted message is not lost silently: a zero-step turn records its drop.
    assert kinds(agent) == ["turn_start", "message_dropped", "turn_end"]
    dropped = agent.session.events[1].message_dropped
    assert dropped.content[0].text.text == "a"
    assert dropped.reason == "cancelled: never mind"
    assert turn_ends(agent)[0].aborted.reason == "never mind"
    assert agent.session.inbox.pending() == []


async def test_resume_continues_history_turns_and_seqs(harness: Harness) -> None:
    agent = await harness.create(session_id="keep", script=[text_step("one")], model="m")
    await harness.turn(agent, "first")
    before = [e.SerializeToString() for e in agent.session.events]
    history = agent.session.derive_messages()
    await harness.factory.dispose("a1")
    script = script_options([text_step("unused"), text_step("two")])
    options = agent_pb2.AgentOptions(provider="scripted", model="m", provider_options=script)
    sources: list[int] = []
    harness.runtime.seams.on(S.SESSION_START, lambda started: sources.append(started.source))
    resumed = await harness.factory.resume("a2", "keep", options)
    harness.created.append(resumed)
    assert [e.SerializeToString() for e in resumed.session.events] == before
    assert resumed.session.derive_messages() == history
    await harness.turn(resumed, "second")
    events = resumed.session.events
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.turn_start.turn for e in events if e.HasField("turn_start")] == [1, 2]
    headers = [e.request_header.reason for e in events if e.HasField("request_header")]
    assert headers == [1, 2]  # initial, then resume
    assert sources == [ae.SESSION_START_SOURCE_RESUME]
    second_request = harness.model.requests[-1]
    assert len(second_request.messages) == len(history) + 1


async def test_resume_of_a_live_session_is_refused(harness: Harness) -> None:
    await harness.create(session_id="busy")
    with pytest.raises(FailedPrecondition, match="busy"):
        await harness.factory.resume("other", "busy", agent_pb2.AgentOptions())


async def test_idle_inject_survives_dispose_and_resume(harness: Harness) -> None:
    agent = await harness.create(session_id="inj", script=[text_step("x")])
    agent.inject(d.HookContext(content=[text_block("remember")]))
    await harness.factory.dispose("a1")
    resumed = await harness.factory.resume("a2", "inj", agent_pb2.AgentOptions(model="m"))
    harness.created.append(resumed)
    assert kinds(resumed) == ["turn_start", "context_message", "turn_end"]
