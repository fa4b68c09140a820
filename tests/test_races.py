"""Races and lifecycles at the edges: same-id creation, vetoes, disposal, waiters, cursors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentloop.v1 import agent_pb2
from server.kernel import seams as S
from server.kernel.errors import AlreadyExists, InvalidArgument
from server.kernel.tools import Tool, ToolExecution
from server.stores.sqlite import SqliteStore
from tests.harness import Harness, kinds, reason_kinds, text_block, text_step, tool_step


async def test_same_id_creations_on_a_yielding_store_have_one_winner(tmp_path: Path) -> None:
    h = Harness(store=SqliteStore(tmp_path / "agentloop.db"))
    results = await asyncio.gather(
        h.create("x", session_id="s1", persona="winner one"),
        h.create("x", session_id="s2", persona="winner two"),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1 and isinstance(results[1], AlreadyExists)
    sections = [section.name for section in h.runtime.prompts.sections_for("x")]
    assert "persona" in sections  # the loser did not unwind the winner's scope
    assert await h.runtime.store.list_ids() == [winners[0].session.session_id]
    await h.factory.close()
    await h.runtime.store.close()


async def test_a_vetoed_creation_stores_no_session(harness: Harness) -> None:
    def veto(agent: S.SeamAgent) -> None:
        raise RuntimeError("no")

    dispose = harness.runtime.seams.on(S.CREATED, veto)
    with pytest.raises(RuntimeError):
        await harness.create("v", session_id="vs")
    assert not await harness.runtime.store.exists("vs")
    dispose()
    await harness.create("v", session_id="vs")  # both ids are free again


async def test_when_idle_during_disposal_waits_for_the_closed_turn(harness: Harness) -> None:
    agent = await harness.create(script=[tool_step(("sleep", '{"seconds": 5}'))], tools=["sleep"])
    agent.send([text_block("go")])
    await agent.session.wait_beyond(5)
    waiter = asyncio.ensure_future(agent.when_idle())
    await asyncio.sleep(0)
    disposal = asyncio.ensure_future(harness.factory.dispose("a1"))
    await asyncio.wait_for(waiter, 5)
    assert kinds(agent)[-1] == "turn_end"  # not just "disposal began"
    assert reason_kinds(agent) == ["disposed"]
    await disposal


async def test_timed_out_idle_waiters_are_not_kept(harness: Harness) -> None:
    agent = await harness.create(script=[tool_step(("sleep", '{"seconds": 5}'))], tools=["sleep"])
    agent.send([text_block("go")])
    await agent.session.wait_beyond(5)
    for _ in range(50):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(agent.when_idle(), 0.001)
    assert agent._idle_waiters == []
    agent.cancel()


async def test_a_recreated_agent_starts_its_script_afresh(harness: Harness) -> None:
    first = await harness.create("s", script=[text_step("FIRST"), text_step("SECOND")])
    await harness.turn(first, "hi")
    await harness.factory.dispose("s")
    again = await harness.create("s", script=[text_step("FIRST")])
    await harness.turn(again, "hi")
    message = [e for e in again.session.events if e.HasField("assistant_message")][-1]
    assert message.assistant_message.content[0].text.text == "FIRST"


async def test_a_persona_with_a_bad_variable_is_refused_at_creation(harness: Harness) -> None:
    with pytest.raises(InvalidArgument, match=r'^options.persona: unknown prompt variable "nme"'):
        await harness.create("p", persona="Hello {{nme}}")
    with pytest.raises(InvalidArgument, match="^options.persona:"):
        await harness.create("p", persona="Broken {{ model }} here")
    await harness.create("p", persona="Fine: {{model}} in {{cwd}}", cwd="/w")


async def test_a_tool_that_is_cancelled_from_inside_is_an_error_result(harness: Harness) -> None:
    async def self_cancelling(exec_: ToolExecution) -> str:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        inner.cancel()
        await inner  # raises CancelledError into the tool, not from the loop
        return "unreachable"

    harness.runtime.tools.register(
        Tool(name="fragile", description="d", input_schema={}, execute=self_cancelling,
             opt_in=False)
    )  # fmt: skip
    agent = await harness.create(script=[tool_step(("fragile", "{}")), text_step("ok")])
    await harness.turn(agent, "go")
    result = next(e.tool_result for e in agent.session.events if e.HasField("tool_result"))
    assert result.is_error and result.error.code == "CANCELLED"
    assert reason_kinds(agent) == ["completed"]
    agent.send([text_block("still alive")])
    await asyncio.wait_for(agent.when_idle(), 5)
    assert agent.session.max_turn == 2


async def test_concurrent_teardowns_run_once(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("x")])
    await asyncio.gather(harness.factory.teardown(agent), harness.factory.teardown(agent))
    disposed = [e for e in harness.agent_events["a1"] if e.HasField("disposed")]
    assert len(disposed) == 1
    options = agent_pb2.AgentOptions(provider="scripted", model="m")
    again = await harness.factory.create("a1", options)
    harness.created.append(again)
