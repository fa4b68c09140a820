"""Interception seams: prompt-submit, turn-stop, and the failure contracts around them."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from server.kernel import seams as S
from server.kernel.content import plain_text
from server.kernel.tools import ToolExecution
from server.loop.agent import Agent
from server.sessions.persistence import SESSION_FLUSH
from tests.harness import Harness, kinds, reason_kinds, text_block, text_step, tool_step, turn_ends


def block(reason: str) -> d.PromptDecision:
    return d.PromptDecision(block=d.PromptBlock(reason=reason))


async def test_prompt_submit_allow_passes_through_unchanged(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])

    async def allow(
        call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
    ) -> d.PromptDecision:
        return d.PromptDecision(allow=d.PromptAllow())

    harness.runtime.seams.on(S.PROMPT_SUBMIT, allow)
    await harness.turn(agent, "as is")
    message = agent.session.events[1].user_message
    assert plain_text(message.content) == "as is" and message.source.kind == "user"


async def test_prompt_submit_rewrites_and_adds_contexts_visible_to_pre_step(
    harness: Harness,
) -> None:
    agent = await harness.create(script=[text_step("ok")])
    seen_at_pre_step: list[list[str]] = []

    async def rewrite(
        call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
    ) -> d.PromptDecision:
        extra = d.HookContext(content=[text_block("extra")], source=c.Source(kind="plugin"))
        return d.PromptDecision(
            allow=d.PromptAllow(content=[text_block("rewritten")], additional_contexts=[extra])
        )

    def pre_step(call: S.PreStep) -> None:
        seen_at_pre_step.append([plain_text(m.content) for m in agent.session.derive_messages()])

    harness.runtime.seams.on(S.PROMPT_SUBMIT, rewrite)
    harness.runtime.seams.on(S.PRE_STEP, pre_step)
    await harness.turn(agent, "original")
    assert kinds(agent)[:3] == ["turn_start", "user_message", "context_message"]
    assert seen_at_pre_step == [["rewritten", '<context source="plugin">\nextra\n</context>']]
    assert [plain_text(m.content) for m in harness.model.requests[0].messages][0] == "rewritten"


async def test_blocking_the_only_prompt_is_a_zero_step_rejected_turn(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])

    async def veto(
        call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
    ) -> d.PromptDecision:
        return block("not allowed")

    harness.runtime.seams.on(S.PROMPT_SUBMIT, veto)
    await harness.turn(agent, "rm -rf /")
    assert kinds(agent) == ["turn_start", "prompt_blocked", "turn_end"]
    blocked = agent.session.events[1].prompt_blocked
    assert (plain_text(blocked.content), blocked.reason) == ("rm -rf /", "not allowed")
    assert turn_ends(agent)[0].rejected.reason == "not allowed"
    assert harness.model.requests == []
    assert agent.session.derive_messages() == []


async def test_mixed_batch_blocks_one_and_answers_the_other(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])

    async def veto_a(
        call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
    ) -> d.PromptDecision:
        return block("A is bad") if plain_text(call.content) == "A" else await next_()

    harness.runtime.seams.on(S.PROMPT_SUBMIT, veto_a)
    agent.send([text_block("A")])
    agent.send([text_block("B")])
    await asyncio.wait_for(agent.when_idle(), 5)
    assert kinds(agent)[:3] == ["turn_start", "prompt_blocked", "user_message"]
    assert reason_kinds(agent) == ["completed"]


async def test_throwing_prompt_submit_fails_at_step_zero_and_the_loop_survives(
    harness: Harness,
) -> None:
    agent = await harness.create(script=[text_step("ok")])
    fired: list[int] = []

    async def boom(
        call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
    ) -> d.PromptDecision:
        if not fired:
            fired.append(1)
            raise RuntimeError("policy crashed")
        return await next_()

    harness.runtime.seams.on(S.PROMPT_SUBMIT, boom)
    await harness.turn(agent, "one")
    # The message the failed turn drained is recorded as dropped, not lost silently.
    assert kinds(agent) == ["turn_start", "message_dropped", "turn_end"]
    assert "policy crashed" in agent.session.events[1].message_dropped.reason
    error = turn_ends(agent)[0].error
    assert error.step == 0 and "policy crashed" in error.message
    await harness.turn(agent, "two")
    assert reason_kinds(agent) == ["error", "completed"]


async def test_waterfall_listeners_compose_in_order(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])

    def suffix(tag: str) -> Any:
        async def listener(
            call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
        ) -> d.PromptDecision:
            decision = await next_()
            current = list(decision.allow.content) or list(call.content)
            return d.PromptDecision(
                allow=d.PromptAllow(content=[text_block(plain_text(current) + tag)])
            )

        return listener

    # Outer listeners see what inner ones returned: order 1 wraps order 2.
    harness.runtime.seams.on(S.PROMPT_SUBMIT, suffix("-second"), order=2, name="b")
    harness.runtime.seams.on(S.PROMPT_SUBMIT, suffix("-first"), order=1, name="a")
    await harness.turn(agent, "p")
    assert plain_text(agent.session.events[1].user_message.content) == "p-second-first"


async def test_turn_stop_is_terminal_and_discards_steering(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])

    def steer_on_step_end(event: ev.SessionEvent) -> None:
        if event.HasField("step_end"):
            agent.steer([text_block("discard me")])

    def stop(call: S.TurnStop) -> d.ContinuationStop:
        return d.ContinuationStop()

    agent.session.observers.append(steer_on_step_end)
    harness.runtime.seams.on(S.TURN_STOP, stop, agent_id="a1")
    await harness.turn(agent, "go")
    k = kinds(agent)
    assert k.count("step_start") == 1 and "steering_message" not in k
    assert k.count("turn_start") == 1
    assert len(harness.model.requests) == 1


async def test_turn_stop_keeps_an_ordinary_send_made_during_the_flush(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    sent: list[int] = []

    def stop(call: S.TurnStop) -> d.ContinuationStop:
        return d.ContinuationStop()

    async def on_flush(session: Any) -> None:
        if not sent:
            sent.append(1)
            agent.steer([text_block("late steering is dropped")])
            agent.send([text_block("a plain send survives")])

    harness.runtime.seams.on(S.TURN_STOP, stop)
    harness.runtime.seams.on(SESSION_FLUSH, on_flush)
    await harness.turn(agent, "go")
    prompts = [plain_text(e.user_message.content) for e in agent.session.events
               if e.HasField("user_message")]  # fmt: skip
    assert prompts == ["go", "a plain send survives"]
    assert "steering_message" not in kinds(agent)


async def test_scoped_turn_stop_affects_only_its_agent(harness: Harness) -> None:
    first = await harness.create("first", script=[text_step("1"), text_step("2")])
    second = await harness.create("second", script=[text_step("1"), text_step("2")])
    harness.runtime.seams.on(S.TURN_STOP, lambda call: d.ContinuationStop(),
                             agent_id="first")  # fmt: skip

    async def always_continue_once(
        call: S.TurnContinuation, next_: S.Next[S.TurnContinuation, d.ContinuationDecision]
    ) -> d.ContinuationDecision:
        if len(cast(Agent, call.agent).session.events) < 14:
            return d.ContinuationDecision(continue_turn=d.ContinuationContinue())
        return await next_()

    harness.runtime.seams.on(S.TURN_CONTINUATION, always_continue_once)
    await harness.turn(first, "go")
    await harness.turn(second, "go")
    assert kinds(first).count("step_start") == 1
    assert kinds(second).count("step_start") == 2


async def test_throwing_turn_stop_fails_the_turn_and_the_driver_survives(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    fired: list[int] = []

    def policy(call: S.TurnStop) -> None:
        if not fired:
            fired.append(1)
            raise RuntimeError("policy failed")
        return None

    harness.runtime.seams.on(S.TURN_STOP, policy)
    await harness.turn(agent, "one")
    await harness.turn(agent, "two")
    assert reason_kinds(agent) == ["error", "completed"]


async def test_throwing_turn_continuation_is_an_error(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one")])

    def boom(call: S.TurnContinuation, next_: object) -> d.ContinuationDecision:
        raise RuntimeError("continuation failed")

    harness.runtime.seams.on(S.TURN_CONTINUATION, boom)
    await harness.turn(agent, "go")
    assert kinds(agent)[-2:] == ["step_end", "turn_end"]
    assert "continuation failed" in turn_ends(agent)[0].error.message


async def test_a_rejecting_flush_is_reported_and_the_agent_survives(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    failures: list[int] = []

    async def flaky(session: Any) -> None:
        if not failures:
            failures.append(1)
            raise OSError("disk full")

    harness.runtime.seams.on(SESSION_FLUSH, flaky)
    await harness.turn(agent, "one")
    await harness.turn(agent, "two")
    errors = [e.error for e in harness.agent_events["a1"] if e.HasField("error")]
    assert [(e.turn, e.message) for e in errors] == [(1, "disk full")]
    assert reason_kinds(agent) == ["completed", "completed"]


async def test_a_throwing_error_listener_still_balances_the_turn(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("x", finish=3)])

    def boom(failed: S.AgentFailed) -> None:
        raise RuntimeError("error listener broke")

    harness.runtime.seams.on(S.ERROR, boom)
    await harness.turn(agent, "go")
    assert reason_kinds(agent) == ["error"]


async def test_pre_step_that_disposes_then_throws_ends_disposed(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("x")])

    def dispose_then_throw(call: S.PreStep) -> None:
        agent.stop()
        raise RuntimeError("after dispose")

    harness.runtime.seams.on(S.PRE_STEP, dispose_then_throw)
    agent.send([text_block("go")])
    await asyncio.wait_for(agent.driver, 5)  # type: ignore[arg-type]
    assert reason_kinds(agent) == ["disposed"]


async def test_pre_commit_veto_of_step_start_is_a_turn_error_without_a_step(
    harness: Harness,
) -> None:
    agent = await harness.create(script=[text_step("x")])

    def veto(event: ev.SessionEvent) -> None:
        if event.HasField("step_start"):
            raise ValueError("vetoed step/start")

    agent.session.pre_commit.append(veto)
    await harness.turn(agent, "go")
    assert kinds(agent) == ["turn_start", "user_message", "turn_end"]
    assert "vetoed step/start" in turn_ends(agent)[0].error.message
    assert harness.model.requests == []


async def test_one_shot_turn_end_veto_keeps_the_first_error(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("x", finish=3, error_message="model down")])
    vetoed: list[int] = []

    def veto_once(event: ev.SessionEvent) -> None:
        if event.HasField("turn_end") and not vetoed:
            vetoed.append(1)
            raise ValueError("turn/end vetoed")

    agent.session.pre_commit.append(veto_once)
    await harness.turn(agent, "go")
    assert kinds(agent).count("turn_end") == 1
    assert turn_ends(agent)[0].error.message == "model down"


async def test_tool_result_keeps_the_model_call_id_when_post_execute_rewrites(
    harness: Harness,
) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text":"a"}')), text_step("ok")], tools=["word_count"]
    )

    async def post(call: S.ToolCallResult, next_: object) -> d.PostToolDecision:
        return d.PostToolDecision(accept=d.ToolAccept(content=[text_block("replaced")]))

    harness.runtime.seams.on(S.TOOLS_POST_EXECUTE, post)
    await harness.turn(agent, "go")
    result = next(e.tool_result for e in agent.session.events if e.HasField("tool_result"))
    assert (result.call_id, plain_text(result.content)) == ("c1", "replaced")


async def test_pre_execute_deny_is_an_error_result_the_model_sees(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text":"a"}')), text_step("ok")], tools=["word_count"]
    )

    async def deny(exec_: ToolExecution, next_: object) -> d.PreToolDecision:
        return d.PreToolDecision(deny=d.ToolDeny(reason="not today"))

    harness.runtime.seams.on(S.TOOLS_PRE_EXECUTE, deny)
    await harness.turn(agent, "go")
    result = next(e.tool_result for e in agent.session.events if e.HasField("tool_result"))
    assert result.is_error and plain_text(result.content) == "Error: not today"
    seen = harness.model.requests[1].messages[-1].content[0].tool_result
    assert seen.is_error and plain_text(seen.content) == "Error: not today"
