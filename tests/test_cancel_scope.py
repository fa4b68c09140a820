"""One way to cancel: a turn's cancel scope, and the task group an agent's tasks live in."""

from __future__ import annotations

import asyncio

import pytest

from agentloop.v1 import agent_pb2
from agentloop.v1 import approval_pb2 as ap
from agentloop.v1 import decision_pb2 as d
from server.edge.app import App
from server.kernel import seams as S
from server.kernel.cancel import CancelScope
from server.kernel.errors import Aborted
from server.kernel.tasks import TaskGroup, cancel_and_wait
from server.kernel.tools import ToolExecution
from server.settings.config import Config
from tests.harness import Harness, kinds, text_block, text_step, tool_step, turn_ends

T = 10.0
"""A hang guard, never a measured time."""


# -- the scope ---------------------------------------------------------------------------


async def test_a_cancel_from_another_task_ends_the_await_and_is_caught_with_its_reason() -> None:
    scope = CancelScope()
    entered = asyncio.Event()
    caught: list[bool] = []

    async def work() -> str:
        with scope:
            try:
                entered.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError as error:
                caught.append(scope.caught(error))
        await asyncio.sleep(0)  # nothing of the cancellation is left on the task
        task = asyncio.current_task()
        assert task is not None
        return f"cancelling={task.cancelling()}"

    task = asyncio.ensure_future(work())
    async with asyncio.timeout(T):
        await entered.wait()
        scope.cancel("user interrupt")
        assert await task == "cancelling=0"
    assert caught == [True]
    assert scope.signal.aborted and scope.signal.reason == "user interrupt"


async def test_a_cancel_from_inside_the_scope_is_delivered_at_the_next_await() -> None:
    scope = CancelScope()
    trace: list[str] = []
    with scope:
        scope.cancel("stop")
        trace.append("after cancel")  # a cancel from the scope's own task is not raised here
        assert scope.signal.aborted
        with pytest.raises(asyncio.CancelledError) as raised:
            await asyncio.sleep(0)
        assert scope.caught(raised.value)
    await asyncio.sleep(0)  # withdrawn: this await is not cancelled
    assert trace == ["after cancel"]


async def test_a_checkpoint_raises_the_cancellation_of_a_marked_scope() -> None:
    scope = CancelScope()
    with scope:
        scope.checkpoint()  # not cancelled: nothing happens
        scope.mark("before it began")
        assert not scope.signal.aborted  # a marker fires nothing
        with pytest.raises(asyncio.CancelledError) as raised:
            scope.checkpoint()
        assert scope.caught(raised.value)
    assert scope.reason == "before it began"


async def test_a_shielded_block_hears_a_cancel_only_through_the_signal() -> None:
    scope = CancelScope()
    done = asyncio.Event()

    async def canceller() -> None:
        await asyncio.sleep(0)
        scope.cancel("stop")
        await asyncio.sleep(0)
        done.set()

    with scope:
        helper = asyncio.ensure_future(canceller())
        with scope.shielded():
            async with asyncio.timeout(T):
                await done.wait()  # not cancelled: the shield holds
        assert scope.signal.reason == "stop"
        await helper
        with pytest.raises(asyncio.CancelledError):
            scope.checkpoint()


async def test_aborted_is_the_scopes_once_its_signal_fired() -> None:
    scope = CancelScope()
    with scope:
        assert not scope.caught(Aborted("elsewhere"))  # not cancelled: not ours
        assert not scope.caught(RuntimeError("boom"))
        scope.cancel("stop")
        assert scope.caught(Aborted("stop"))


async def test_a_cancellation_that_is_not_the_scopes_propagates() -> None:
    scope = CancelScope()
    entered = asyncio.Event()
    verdicts: list[bool] = []

    async def work() -> None:
        with scope:
            try:
                entered.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError as error:
                verdicts.append(scope.caught(error))
                raise

    task = asyncio.ensure_future(work())
    async with asyncio.timeout(T):
        await entered.wait()
        scope.cancel("stop")
        task.cancel()  # the owner of the task cancels it too (a shutdown)
        with pytest.raises(asyncio.CancelledError):
            await task
    assert verdicts == [False]
    assert task.cancelled()


# -- the task group ----------------------------------------------------------------------


async def test_a_task_group_closes_by_cancelling_and_awaiting_everything() -> None:
    group = TaskGroup("g")
    cancelled: list[str] = []
    finished: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            if name == "a":
                group.start(forever("a's heir"))  # started while closing: cancelled too
            raise

    async def quick() -> None:
        finished.append("quick")

    group.start(forever("a"))
    await group.start(quick())
    assert len(group) == 1  # an ended task leaves the group
    async with asyncio.timeout(T):
        await group.close()
    assert finished == ["quick"]
    assert cancelled == ["a", "a's heir"]
    assert len(group) == 0


async def test_cancel_and_wait_leaves_finished_tasks_and_drops_failures() -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    failed = asyncio.ensure_future(fail())
    await asyncio.sleep(0)
    waiting = asyncio.ensure_future(asyncio.Event().wait())
    async with asyncio.timeout(T):
        await cancel_and_wait([failed, waiting])
    assert waiting.cancelled()
    assert isinstance(failed.exception(), RuntimeError)


# -- in the loop -------------------------------------------------------------------------


async def test_a_cancel_reaches_a_listener_that_awaits_without_watching_the_signal(
    harness: Harness,
) -> None:
    agent = await harness.create(script=[text_step("answered")])
    entered = asyncio.Event()
    cancelled: list[str] = []

    async def pre_step(call: S.PreStep) -> None:
        if entered.is_set():
            return  # the next turn runs through
        entered.set()
        try:
            await asyncio.Event().wait()  # ignores `call.signal`
        except asyncio.CancelledError:
            cancelled.append(call.signal.reason)
            raise

    harness.runtime.seams.on(S.PRE_STEP, pre_step)
    agent.send([text_block("go")])
    async with asyncio.timeout(T):
        await entered.wait()
        assert agent.cancel("user interrupt") == (True, 0)
        await agent.when_idle()
    assert cancelled == ["user interrupt"]
    assert [r.aborted.reason for r in turn_ends(agent)] == ["user interrupt"]
    assert "step_start" not in kinds(agent)
    assert harness.model.requests == []
    assert agent.loop.turn is None and agent.loop.cancel_reason is None
    task = agent.driver
    assert task is not None and not task.done()
    await harness.turn(agent, "again")  # the driver goes on, with no cancel left on it
    assert [r.WhichOneof("kind") for r in turn_ends(agent)] == ["aborted", "completed"]


async def test_disposal_reaches_a_listener_that_awaits_without_watching_the_signal(
    harness: Harness,
) -> None:
    agent = await harness.create(script=[text_step("unreachable")])
    entered = asyncio.Event()
    cancelled: list[str] = []

    async def prompt_submit(
        call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
    ) -> d.PromptDecision:
        entered.set()
        try:
            await asyncio.Event().wait()  # ignores `call.signal`
        except asyncio.CancelledError:
            cancelled.append(call.signal.reason)
            raise
        return await next_()

    harness.runtime.seams.on(S.PROMPT_SUBMIT, prompt_submit)
    agent.send([text_block("go")])
    async with asyncio.timeout(T):
        await entered.wait()
        await harness.factory.dispose("a1")  # no grace period here: it must not hang
    assert cancelled == ["disposed"]
    assert [r.WhichOneof("kind") for r in turn_ends(agent)] == ["disposed"]
    assert harness.model.requests == []
    assert len(agent.tasks) == 0


async def test_no_task_of_an_agent_outlives_its_disposal(harness: Harness) -> None:
    # Two calls, so that the first waits in the pool (a batch's last call, with nothing
    # else in flight, runs on the driver's task); the second is denied before it starts.
    calls = [("word_count", '{"text": "a b"}'), ("word_count", '{"text": "c"}')]
    agent = await harness.create(
        script=[tool_step(*calls), text_step("done")],
        tools=["word_count"],
    )
    asked = asyncio.Event()
    approver_cancelled: list[str] = []

    def pre_execute(
        exec: ToolExecution, next_: S.Next[ToolExecution, d.PreToolDecision]
    ) -> d.PreToolDecision:
        if exec.call_id == "c2":
            return d.PreToolDecision(deny=d.ToolDeny(reason="not this one"))
        return d.PreToolDecision(ask=d.ToolAsk(reason="check"))

    async def approver(ask: S.ApprovalAsk) -> S.ApprovalAnswer:
        asked.set()
        try:
            await asyncio.Event().wait()  # never answers, ignores its signal
        except asyncio.CancelledError:
            approver_cancelled.append(ask.request.tool_name)
            raise
        return (ap.APPROVAL_DECISION_ALLOW_ONCE, "")

    harness.runtime.seams.on(S.TOOLS_PRE_EXECUTE, pre_execute)
    harness.runtime.seams.on(S.TOOLS_APPROVAL, approver)
    agent.send([text_block("count")])
    async with asyncio.timeout(T):
        await asked.wait()
        assert len(agent.tasks) == 3  # the driver, the call waiting in the pool, the ask
        await harness.factory.dispose("a1")
    assert approver_cancelled == ["word_count"]
    assert len(agent.tasks) == 0
    assert [r.WhichOneof("kind") for r in turn_ends(agent)] == ["disposed"]


async def test_a_stop_cancels_the_task_group_of_an_agent_that_outlasts_its_grace() -> None:
    app = App(Config(listen="127.0.0.1:0", store="memory", agents=()))
    await app.start()
    entered = asyncio.Event()
    trace: list[str] = []

    async def prompt_submit(
        call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
    ) -> d.PromptDecision:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            trace.append("disposal cancelled the turn; ignored")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            trace.append("the stop cancelled the agent's tasks")
            raise
        return await next_()

    app.runtime.seams.on(S.PROMPT_SUBMIT, prompt_submit)
    agent = await app.factory.create("stuck", agent_pb2.AgentOptions(provider="scripted"))
    agent.send([text_block("p")])
    async with asyncio.timeout(T):
        await entered.wait()
        await app.stop(grace=0.1)
    assert trace == ["disposal cancelled the turn; ignored", "the stop cancelled the agent's tasks"]
    assert agent.driver is not None and agent.driver.cancelled()
    assert len(agent.tasks) == 0
    assert app.factory.agents == {}
