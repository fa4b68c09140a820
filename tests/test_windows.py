"""Cancel and dispose windows, flush ordering, header changes, and tool batch edges."""

from __future__ import annotations

import asyncio

import pytest

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from server.kernel import seams as S
from server.kernel.content import plain_text
from server.kernel.prompt import Assembly
from server.kernel.tools import Tool, ToolExecution, ToolReturn
from server.sessions.persistence import SESSION_FLUSH
from server.sessions.session import SessionLog
from tests.harness import Harness, kinds, reason_kinds, text_block, text_step, tool_step, turn_ends


async def test_cancel_during_session_prefix_aborts_and_the_prefix_is_recomposed(
    harness: Harness,
) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    composed: list[int] = []

    async def prefix(
        call: S.SessionPrefix, next_: S.Next[S.SessionPrefix, list[c.Message]]
    ) -> list[c.Message]:
        composed.append(1)
        if len(composed) == 1:
            agent.cancel("stop composing")
        return [c.Message(role=c.ROLE_USER, content=[text_block("P")]), *(await next_())]

    harness.runtime.seams.on(S.SESSION_PREFIX, prefix)
    await harness.turn(agent, "first")
    assert kinds(agent) == ["turn_start", "user_message", "turn_end"]
    assert turn_ends(agent)[0].aborted.reason == "stop composing"
    await harness.turn(agent, "second")
    assert composed == [1, 1]  # the interrupted composition was not cached
    assert plain_text(harness.model.requests[0].messages[0].content) == "P"


async def test_dispose_during_session_prefix_ends_disposed(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one")])

    async def prefix(
        call: S.SessionPrefix, next_: S.Next[S.SessionPrefix, list[c.Message]]
    ) -> list[c.Message]:
        agent.stop()
        return await next_()

    harness.runtime.seams.on(S.SESSION_PREFIX, prefix)
    agent.send([text_block("go")])
    assert agent.driver is not None
    await asyncio.wait_for(agent.driver, 5)
    assert reason_kinds(agent) == ["disposed"]
    assert harness.model.requests == []


async def test_dispose_from_a_step_start_observer_makes_no_request(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one")])
    agent.session.observers.append(lambda e: agent.stop() if e.HasField("step_start") else None)
    agent.send([text_block("go")])
    assert agent.driver is not None
    await asyncio.wait_for(agent.driver, 5)
    assert kinds(agent) == ["turn_start", "user_message", "step_start", "step_end", "turn_end"]
    assert reason_kinds(agent) == ["disposed"]
    assert harness.model.requests == []


async def test_cancel_in_the_continuation_window_stops_after_one_step(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text":"a"}')), text_step("never")], tools=["word_count"]
    )

    async def continuation(
        call: S.TurnContinuation, next_: S.Next[S.TurnContinuation, d.ContinuationDecision]
    ) -> d.ContinuationDecision:
        decision = await next_()
        agent.cancel("window")
        return decision

    harness.runtime.seams.on(S.TURN_CONTINUATION, continuation)
    await harness.turn(agent, "go")
    assert kinds(agent).count("step_start") == 1
    assert turn_ends(agent)[0].aborted.reason == "window"


async def test_a_running_listener_that_cancels_and_queues_replacement_work(
    harness: Harness,
) -> None:
    agent = await harness.create(script=[text_step("B answered")])
    state = {"cancelled": False}

    def on_status(changed: S.StatusChanged) -> None:
        if changed.status == "running" and not state["cancelled"]:
            state["cancelled"] = True
            agent.cancel()
            agent.send([text_block("B")])

    harness.runtime.seams.on(S.STATUS, on_status)
    agent.send([text_block("A")])
    await asyncio.wait_for(agent.when_idle(), 5)
    prompts = [plain_text(e.user_message.content) for e in agent.session.events
               if e.HasField("user_message")]  # fmt: skip
    assert prompts == ["B"]  # A was dropped, B ran, and when_idle waited for it
    dropped = [plain_text(e.message_dropped.content) for e in agent.session.events
               if e.HasField("message_dropped")]  # fmt: skip
    assert dropped == ["A"]  # recorded, in the zero-step turn of the cancel
    assert reason_kinds(agent) == ["aborted", "completed"]


async def test_the_flush_is_awaited_before_idle(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one")])
    seen: list[int] = []

    async def slow_flush(session: SessionLog) -> None:
        await asyncio.sleep(0.01)
        seen.append(agent.status)

    harness.runtime.seams.on(SESSION_FLUSH, slow_flush)
    await harness.turn(agent, "go")
    assert seen == [ae.AGENT_STATUS_RUNNING]
    assert agent.status == ae.AGENT_STATUS_IDLE


async def test_a_failed_idle_inject_flush_is_an_error_at_step_zero(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one")])

    async def broken(session: SessionLog) -> None:
        raise OSError("disk gone")

    harness.runtime.seams.on(SESSION_FLUSH, broken)
    agent.inject(d.HookContext(content=[text_block("note")]))
    await asyncio.gather(*agent.pending_flushes)
    errors = [e.error for e in harness.agent_events["a1"] if e.HasField("error")]
    assert [(e.turn, e.step, e.message) for e in errors] == [(1, 0, "disk gone")]
    assert kinds(agent) == ["turn_start", "context_message", "turn_end"]


async def test_tool_meta_is_threaded_onto_the_result(harness: Harness) -> None:
    async def with_meta(exec_: ToolExecution) -> ToolReturn:
        return ToolReturn(content="done", meta={"bytes": 12, "path": "/tmp/x"})

    harness.runtime.tools.register(
        Tool(name="meta_tool", description="d", input_schema={}, execute=with_meta, opt_in=False)
    )
    agent = await harness.create(script=[tool_step(("meta_tool", "{}")), text_step("ok")])
    await harness.turn(agent, "go")
    result = next(e.tool_result for e in agent.session.events if e.HasField("tool_result"))
    assert result.meta["path"] == "/tmp/x" and result.meta["bytes"] == 12
    assert all("path" not in plain_text(m.content) for m in harness.model.requests[1].messages)


async def test_an_emptied_assembly_omits_the_system_prompt(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one")])

    async def empty(assembly: Assembly, next_: object) -> Assembly:
        return Assembly(sections=[], variables={})

    harness.runtime.seams.on(S.SYSTEM_PROMPT_ASSEMBLE, empty)
    await harness.turn(agent, "go")
    assert harness.model.requests[0].header.system == ""
    header = next(e.request_header for e in agent.session.events if e.HasField("request_header"))
    assert not header.header.system


async def test_a_new_tool_between_turns_logs_a_changed_header(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    await harness.turn(agent, "first")

    async def extra(exec_: ToolExecution) -> str:
        return "x"

    harness.runtime.tools.register(
        Tool(name="extra", description="d", input_schema={}, execute=extra, opt_in=False)
    )
    await harness.turn(agent, "second")
    reasons = [
        e.request_header.reason for e in agent.session.events if e.HasField("request_header")
    ]
    assert reasons == [ev.HEADER_REASON_INITIAL, ev.HEADER_REASON_CHANGE]
    assert [t.name for t in harness.model.requests[1].header.tools] == ["extra"]


async def test_context_accepted_before_a_tool_abort_is_recorded(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text":"a"}'), ("sleep", '{"seconds": 5}'))],
        tools=["word_count", "sleep"],
        max_parallel_tool_calls=1,
    )

    async def post(
        call: S.ToolCallResult, next_: S.Next[S.ToolCallResult, d.PostToolDecision]
    ) -> d.PostToolDecision:
        if call.exec.name == "word_count":
            note = d.HookContext(content=[text_block("after word_count")])
            asyncio.get_running_loop().call_later(0.05, agent.cancel, "user interrupt")
            return d.PostToolDecision(accept=d.ToolAccept(additional_contexts=[note]))
        return await next_()

    harness.runtime.seams.on(S.TOOLS_POST_EXECUTE, post)
    await harness.turn(agent, "go")
    tail = kinds(agent)[kinds(agent).index("tool_call") :]
    assert tail == [
        "tool_call", "tool_result", "tool_call", "tool_result", "context_message",
        "step_end", "turn_end",
    ]  # fmt: skip
    assert turn_ends(agent)[0].aborted.reason == "user interrupt"


async def test_deferred_context_drains_before_disposal_completes(harness: Harness) -> None:
    agent = await harness.create(script=[tool_step(("sleep", '{"seconds": 5}'))], tools=["sleep"])

    def on_call(event: ev.SessionEvent) -> None:
        if event.HasField("tool_call"):
            agent.inject(d.HookContext(content=[text_block("late note")]))
            asyncio.get_running_loop().call_later(0.05, asyncio.ensure_future,
                                                  harness.factory.dispose("a1"))  # fmt: skip

    agent.session.observers.append(on_call)
    agent.send([text_block("go")])
    assert agent.driver is not None
    await asyncio.wait_for(asyncio.shield(agent.driver), 5)
    assert kinds(agent)[-4:] == ["tool_result", "context_message", "step_end", "turn_end"]
    assert reason_kinds(agent) == ["disposed"]


async def test_inject_during_agent_request_joins_the_next_request(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text":"a"}')), text_step("ok")], tools=["word_count"]
    )

    async def request(call: S.Request, next_: S.Next[S.Request, c.ModelConfig]) -> c.ModelConfig:
        if call.step == 1:
            agent.inject(d.HookContext(content=[text_block("late for step 1")]))
        return await next_()

    harness.runtime.seams.on(S.REQUEST, request)
    await harness.turn(agent, "go")
    first, second = harness.model.requests
    assert all("late for step 1" not in plain_text(m.content) for m in first.messages)
    assert any("late for step 1" in plain_text(m.content) for m in second.messages)


async def test_a_one_shot_step_end_veto_keeps_one_error(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("x")])
    vetoed: list[int] = []

    def veto_once(event: ev.SessionEvent) -> None:
        if event.HasField("step_end") and not vetoed:
            vetoed.append(1)
            raise ValueError("step/end vetoed")

    agent.session.pre_commit.append(veto_once)
    await harness.turn(agent, "go")
    assert kinds(agent).count("step_end") == 1
    assert "step/end vetoed" in turn_ends(agent)[0].error.message
    errors = [e for e in harness.agent_events["a1"] if e.HasField("error")]
    assert len(errors) == 1


def test_a_second_provider_of_one_name_is_refused(harness: Harness) -> None:
    with pytest.raises(ValueError, match='"scripted" is already registered'):
        harness.runtime.models.register("scripted", harness.model)


async def test_a_server_wide_tool_order_serves_agents_with_different_tools() -> None:
    ordered = Harness(tool_order=["word_count", "<unlisted-tools>", "echo"])
    everything = await ordered.create(
        "all", script=[text_step("x")], tools=["echo", "sleep", "word_count"]
    )
    fewer = await ordered.create("few", script=[text_step("x")], tools=["sleep"])
    await ordered.turn(everything, "hi")
    await ordered.turn(fewer, "hi")
    names = [[t.name for t in r.header.tools] for r in ordered.model.requests]
    assert names == [["word_count", "sleep", "echo"], ["sleep"]]
    await ordered.factory.close()
