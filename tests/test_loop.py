"""The loop, turn by turn: event order, steering, injection, seams, max-tokens, errors."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

from google.protobuf import duration_pb2

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import scripted_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.kernel import seams as S
from server.kernel.content import plain_text
from server.kernel.prompt import Section
from server.kernel.tools import Tool, ToolExecution
from server.loop.agent import Agent
from tests.harness import (
    ERROR,
    MAX_TOKENS,
    Harness,
    boundaries,
    kinds,
    reason_kinds,
    text_block,
    text_step,
    tool_step,
    turn_ends,
)

USAGE = c.Usage(input_tokens=10, output_tokens=3)


def ctx(text: str, kind: str = "plugin", envelope: int = 0) -> d.HookContext:
    return d.HookContext(content=[text_block(text)], source=c.Source(kind=kind), envelope=envelope)  # type: ignore[arg-type]


def all_text(messages: Sequence[c.Message]) -> str:
    return "\n".join(plain_text(m.content) for m in messages)


async def test_simple_turn_event_order_usage_and_history(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("hello", usage=USAGE, chunk_size=5)])
    await harness.turn(agent, "hi")
    assert kinds(agent) == [
        "turn_start", "user_message", "step_start", "request_header",
        "assistant_chunk", "assistant_chunk", "assistant_chunk", "assistant_chunk",
        "assistant_chunk", "assistant_message", "step_end", "turn_end",
    ]  # fmt: skip
    assert boundaries(agent) == ["turn_start", "step_start", "step_end", "turn_end"]
    events = agent.session.events
    assert events[3].request_header.reason == ev.HEADER_REASON_INITIAL
    message = events[9].assistant_message
    assert message.usage == USAGE
    assert list(events[9].source_event_seqs) == [5, 6, 7, 8, 9]
    assert message.provenance.provider == "scripted"
    history = agent.session.derive_messages()
    assert [m.role for m in history] == [c.ROLE_USER, c.ROLE_ASSISTANT]
    assert reason_kinds(agent) == ["completed"]
    assert harness.status_traces["a1"] == [ae.AGENT_STATUS_RUNNING, ae.AGENT_STATUS_IDLE]


async def test_raw_chunks_of_abc(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("abc", usage=USAGE)])
    await harness.turn(agent, "hi")
    chunks = [e.assistant_chunk.chunk.WhichOneof("chunk") for e in agent.session.events
              if e.HasField("assistant_chunk")]  # fmt: skip
    assert chunks == [
        "block_start", "block_delta", "block_delta", "block_delta", "block_end", "usage", "finish"
    ]  # fmt: skip


async def test_tool_round_trip(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text": "one two three"}')), text_step("done")],
        tools=["word_count"],
    )
    await harness.turn(agent, "count")
    assert boundaries(agent) == [
        "turn_start", "step_start", "step_end", "step_start", "step_end", "turn_end"
    ]  # fmt: skip
    k = kinds(agent)
    assert k.index("tool_call") < k.index("tool_result") < k.index("step_end")
    assert k.count("request_header") == 1  # nothing changed between the steps
    result = next(e for e in agent.session.events if e.HasField("tool_result"))
    assert result.tool_result.call_id == "c1"
    assert plain_text(result.tool_result.content) == "3 words"
    call = next(e for e in agent.session.events if e.HasField("tool_call"))
    assert list(result.source_event_seqs) == [call.seq]
    requests = harness.model.requests
    assert len(requests) == 2
    last = requests[1].messages[-1]
    assert last.content[0].tool_result.tool_call_id == "c1"
    assert [t.name for t in requests[0].header.tools] == ["word_count"]


async def test_default_agent_tool_round_trip_without_script(harness: Harness) -> None:
    agent = await harness.create(tools=["current_time", "word_count"])
    await harness.turn(agent, "how many words is this")
    final = [e for e in agent.session.events if e.HasField("assistant_message")][-1]
    assert "5 words" in plain_text(final.assistant_message.content)
    assert reason_kinds(agent) == ["completed"]


async def test_echo_without_tools_on_the_default_model(harness: Harness) -> None:
    agent = await harness.create(model="")
    await harness.turn(agent, "ping")
    final = [e for e in agent.session.events if e.HasField("assistant_message")][-1]
    assert plain_text(final.assistant_message.content) == "You said: ping"


async def test_steering_between_steps(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text": "a"}')), text_step("ok")], tools=["word_count"]
    )

    def steer_on_call(event: ev.SessionEvent) -> None:
        if event.HasField("tool_call"):
            assert agent.steer([text_block("also this")]) is True

    agent.session.observers.append(steer_on_call)
    await harness.turn(agent, "go")
    k = kinds(agent)
    first_step_end = k.index("step_end")
    assert k.index("steering_message") < first_step_end  # drained inside step 1
    assert k.count("turn_start") == 1 and k.count("step_start") == 2
    second = harness.model.requests[1].messages
    assert '<steering source="user">\nalso this\n</steering>' in all_text(second)


async def test_steer_while_idle_is_send(harness: Harness) -> None:
    agent = await harness.create()
    assert agent.steer([text_block("hello")]) is False
    await asyncio.wait_for(agent.when_idle(), 5)
    assert kinds(agent)[:2] == ["turn_start", "user_message"]
    queued = [e.queued for e in harness.agent_events["a1"] if e.HasField("queued")]
    assert [q.steering for q in queued] == [False]


async def test_idle_inject_is_a_one_shot_turn(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])
    agent.inject(ctx("remember X"))
    assert kinds(agent) == ["turn_start", "context_message", "turn_end"]
    assert agent.session.events[0].turn_start.trigger == ev.TRIGGER_KIND_INJECTION
    assert harness.status_traces["a1"] == []  # the status never left idle
    assert harness.model.requests == []
    await harness.turn(agent, "hi")
    assert agent.session.events[-1].turn_end.turn == 2
    text = all_text(list(harness.model.requests[0].messages))
    assert '<context source="plugin">\nremember X\n</context>' in text


async def test_raw_inject_keeps_meta_and_is_not_wrapped(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])
    context = ctx("verbatim", envelope=ev.CONTEXT_ENVELOPE_RAW)
    context.meta.update({"k": "v"})
    agent.inject(context)
    event = agent.session.events[1].context_message
    assert event.meta["k"] == "v"
    await harness.turn(agent, "hi")
    first = harness.model.requests[0].messages[0]
    assert plain_text(first.content) == "verbatim"


async def test_inject_during_tool_batch_is_deferred_after_results(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text": "a"}')), text_step("ok")], tools=["word_count"]
    )

    async def pre_execute(
        exec_: object, next_: S.Next[ToolExecution, d.PreToolDecision]
    ) -> d.PreToolDecision:
        agent.inject(ctx("during tool 1"))
        agent.inject(ctx("during tool 2"))
        return await next_()

    harness.runtime.seams.on(S.TOOLS_PRE_EXECUTE, pre_execute)
    await harness.turn(agent, "go")
    k = kinds(agent)
    i = k.index("tool_result")
    assert k[i : i + 4] == ["tool_result", "context_message", "context_message", "step_end"]
    second = harness.model.requests[1].messages
    assert second[-3].content[0].HasField("tool_result")
    assert "during tool 1" in plain_text(second[-2].content)


async def test_turn_continuation_can_force_continue_and_force_stop(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("1"), text_step("2"), text_step("3")])
    votes = iter(["continue", "continue", "stop"])

    async def continuation(
        call: S.TurnContinuation, next_: S.Next[S.TurnContinuation, d.ContinuationDecision]
    ) -> d.ContinuationDecision:
        vote = next(votes)
        if vote == "continue":
            return d.ContinuationDecision(continue_turn=d.ContinuationContinue())
        return d.ContinuationDecision(stop=d.ContinuationStop())

    harness.runtime.seams.on(S.TURN_CONTINUATION, continuation)
    await harness.turn(agent, "go")
    assert kinds(agent).count("step_start") == 3


async def test_turn_continuation_vetoes_continuation_after_tool_calls(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text": "a"}'))], tools=["word_count"]
    )

    async def stop(
        call: S.TurnContinuation, next_: S.Next[S.TurnContinuation, d.ContinuationDecision]
    ) -> d.ContinuationDecision:
        return d.ContinuationDecision(stop=d.ContinuationStop())

    harness.runtime.seams.on(S.TURN_CONTINUATION, stop)
    await harness.turn(agent, "go")
    assert kinds(agent).count("step_start") == 1
    assert reason_kinds(agent) == ["completed"]


async def test_continue_with_reason_becomes_steering(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("1"), text_step("2")])
    calls = []

    async def continuation(
        call: S.TurnContinuation, next_: S.Next[S.TurnContinuation, d.ContinuationDecision]
    ) -> d.ContinuationDecision:
        calls.append(call.turn)
        if len(calls) == 1:
            return d.ContinuationDecision(
                continue_turn=d.ContinuationContinue(reason=[text_block("keep going")])
            )
        return await next_()

    harness.runtime.seams.on(S.TURN_CONTINUATION, continuation)
    await harness.turn(agent, "go")
    k = kinds(agent)
    assert k.count("step_start") == 2
    steering = next(e for e in agent.session.events if e.HasField("steering_message"))
    assert steering.steering_message.source.kind == "loop"
    assert k.index("steering_message") == len(k) - 1 - k[::-1].index("step_start") - 1


async def test_request_replacement_switches_model_and_logs_change(harness: Harness) -> None:
    agent = await harness.create(script=[tool_step(("word_count", '{"text":"a"}')),
                                         text_step("ok")], tools=["word_count"])  # fmt: skip

    async def request(call: S.Request, next_: S.Next[S.Request, c.ModelConfig]) -> c.ModelConfig:
        result = await next_()
        if call.step == 2:
            return c.ModelConfig(provider=result.provider, model="bigger")
        return result

    harness.runtime.seams.on(S.REQUEST, request)
    await harness.turn(agent, "go")
    headers = [e.request_header for e in agent.session.events if e.HasField("request_header")]
    assert [h.reason for h in headers] == [ev.HEADER_REASON_INITIAL, ev.HEADER_REASON_CHANGE]
    assert headers[1].header.config.model == "bigger"
    assert harness.model.requests[1].header.config.model == "bigger"


async def test_a_tool_registered_or_removed_between_turns_changes_the_header(
    harness: Harness,
) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two"), text_step("three")])
    await harness.turn(agent, "go")

    async def late(exec: ToolExecution) -> str:
        return "late"

    schema: dict[str, object] = {"type": "object"}
    remove = harness.runtime.tools.register(Tool("late", "For all.", schema, late, opt_in=False))
    await harness.turn(agent, "go")
    remove()
    await harness.turn(agent, "go")
    headers = [e.request_header for e in agent.session.events if e.HasField("request_header")]
    assert [h.reason for h in headers] == [ev.HEADER_REASON_INITIAL] + [ev.HEADER_REASON_CHANGE] * 2
    assert [[t.name for t in h.header.tools] for h in headers] == [[], ["late"], []]
    assert [[t.name for t in r.header.tools] for r in harness.model.requests] == [[], ["late"], []]


async def test_pre_step_fires_per_step_and_its_appends_join_the_request(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text":"a"}')), text_step("ok")], tools=["word_count"]
    )
    seen: list[tuple[int, int]] = []

    async def pre_step(call: S.PreStep) -> None:
        seen.append((call.turn, call.step))
        if call.step == 1:
            agent.inject(ctx("pre-step context"))

    harness.runtime.seams.on(S.PRE_STEP, pre_step)
    await harness.turn(agent, "go")
    assert seen == [(1, 1), (1, 2)]
    k = kinds(agent)
    assert k.index("context_message") < k.index("step_start")
    assert "pre-step context" in all_text(list(harness.model.requests[0].messages))


async def test_throwing_pre_step_fails_the_turn_without_a_step(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])
    fired: list[int] = []

    def pre_step(*args: object) -> None:
        if not fired:
            fired.append(1)
            raise RuntimeError("pre-step broke")

    harness.runtime.seams.on(S.PRE_STEP, pre_step)
    await harness.turn(agent, "one")
    assert kinds(agent) == ["turn_start", "user_message", "turn_end"]
    reason = turn_ends(agent)[0]
    assert reason.error.step == 1 and "pre-step broke" in reason.error.message
    assert harness.model.requests == []
    errors = [e.error for e in harness.agent_events["a1"] if e.HasField("error")]
    assert len(errors) == 1
    await harness.turn(agent, "two")
    assert reason_kinds(agent) == ["error", "completed"]


async def test_cancel_mid_stream_aborts_with_reason(harness: Harness) -> None:
    delay = duration_pb2.Duration(nanos=20_000_000)
    agent = await harness.create(script=[text_step("a long answer", chunk_delay=delay)])

    def cancel_on_chunk(event: ev.SessionEvent) -> None:
        if event.HasField("assistant_chunk"):
            agent.cancel("user interrupt")

    agent.session.observers.append(cancel_on_chunk)
    await harness.turn(agent, "go")
    k = kinds(agent)
    assert "assistant_message" not in k
    assert k[-2:] == ["step_end", "turn_end"]
    assert turn_ends(agent)[0].aborted.reason == "user interrupt"


async def test_default_cancel_reason_and_marker_reset(harness: Harness) -> None:
    delay = duration_pb2.Duration(nanos=20_000_000)
    agent = await harness.create(script=[text_step("slow", chunk_delay=delay), text_step("ok")])
    agent.send([text_block("go")])
    await agent.session.wait_beyond(4)
    assert agent.cancel() == (True, 0)
    await asyncio.wait_for(agent.when_idle(), 5)
    assert turn_ends(agent)[0].aborted.reason == "cancelled"
    await harness.turn(agent, "again")
    assert reason_kinds(agent) == ["aborted", "completed"]


async def test_idle_cancel_is_a_noop(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])
    assert agent.cancel() == (False, 0)
    await harness.turn(agent, "hi")
    assert reason_kinds(agent) == ["completed"]


async def test_cancel_from_turn_start_observer_aborts_without_a_step(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])
    agent.session.observers.append(lambda e: agent.cancel() if e.HasField("turn_start") else None)
    await harness.turn(agent, "go")
    assert kinds(agent) == ["turn_start", "user_message", "turn_end"]
    assert reason_kinds(agent) == ["aborted"]
    assert harness.model.requests == []


async def test_cancel_from_step_start_observer_closes_the_step(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])
    agent.session.observers.append(lambda e: agent.cancel() if e.HasField("step_start") else None)
    await harness.turn(agent, "go")
    assert kinds(agent) == ["turn_start", "user_message", "step_start", "step_end", "turn_end"]
    assert reason_kinds(agent) == ["aborted"]
    assert harness.model.requests == []


async def test_cancel_from_running_listener_opens_no_turn(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])

    def on_status(changed: S.StatusChanged) -> None:
        if changed.status == "running":
            agent.cancel()

    harness.runtime.seams.on(S.STATUS, on_status, agent_id="a1")
    agent.send([text_block("go")])
    await asyncio.wait_for(agent.when_idle(), 5)
    # No step runs; the dropped message is recorded in a zero-step aborted turn.
    assert kinds(agent) == ["turn_start", "message_dropped", "turn_end"]
    assert reason_kinds(agent) == ["aborted"]
    assert harness.model.requests == []


async def test_cancel_clears_steering(harness: Harness) -> None:
    delay = duration_pb2.Duration(nanos=20_000_000)
    agent = await harness.create(script=[text_step("slow", chunk_delay=delay)])

    def on_chunk(event: ev.SessionEvent) -> None:
        if event.HasField("assistant_chunk") and not agent.inbox.steering:
            agent.steer([text_block("s")])
            agent.cancel()

    agent.session.observers.append(on_chunk)
    await harness.turn(agent, "go")
    assert "steering_message" not in kinds(agent)
    assert kinds(agent).count("turn_start") == 1


async def test_max_tokens_drops_tool_calls_and_is_sticky_within_the_turn(harness: Harness) -> None:
    agent = await harness.create(
        script=[
            tool_step(("word_count", '{"text":"a"}'), text="partial", finish=MAX_TOKENS),
            text_step("completed second step"),
            text_step("next turn"),
        ],
        tools=["word_count"],
    )
    forced: list[int] = []

    async def force_one_more(
        call: S.TurnContinuation, next_: S.Next[S.TurnContinuation, d.ContinuationDecision]
    ) -> d.ContinuationDecision:
        if call.turn == 1 and not forced:  # once: the first turn gets a second step
            forced.append(call.turn)
            return d.ContinuationDecision(continue_turn=d.ContinuationContinue())
        return await next_()

    harness.runtime.seams.on(S.TURN_CONTINUATION, force_one_more)
    await harness.turn(agent, "go")
    assert forced == [1]
    assert kinds(agent).count("step_start") == 2
    assert "tool_call" not in kinds(agent)  # the cut step's tool call was dropped
    first, second = (e for e in agent.session.events if e.HasField("assistant_message"))
    assert [b.WhichOneof("block") for b in first.assistant_message.content] == ["text"]
    assert plain_text(second.assistant_message.content) == "completed second step"
    # The second step completed, yet the turn ends max_tokens: the reason is sticky.
    assert reason_kinds(agent) == ["max_tokens"]
    await harness.turn(agent, "again")
    assert reason_kinds(agent) == ["max_tokens", "completed"]  # it does not leak


async def test_empty_max_tokens_message_is_an_anchor_not_history(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text":"a"}'), finish=MAX_TOKENS)], tools=["word_count"]
    )
    await harness.turn(agent, "go")
    message = next(e for e in agent.session.events if e.HasField("assistant_message"))
    assert list(message.assistant_message.content) == []
    assert [m.role for m in agent.session.derive_messages()] == [c.ROLE_USER]


async def test_sends_during_a_turn_chain_into_the_next_turn(harness: Harness) -> None:
    delay = duration_pb2.Duration(nanos=5_000_000)
    agent = await harness.create(script=[text_step("one", chunk_delay=delay), text_step("two")])

    def send_on_chunk(event: ev.SessionEvent) -> None:
        if event.HasField("assistant_chunk") and agent.session.max_turn == 1 and not sent:
            sent.append(1)
            agent.send([text_block("second")])

    sent: list[int] = []
    agent.session.observers.append(send_on_chunk)
    await harness.turn(agent, "first")
    turns = [e.turn_start.turn for e in agent.session.events if e.HasField("turn_start")]
    assert turns == [1, 2]
    # Running across chained turns: one running, one idle.
    assert harness.status_traces["a1"] == [ae.AGENT_STATUS_RUNNING, ae.AGENT_STATUS_IDLE]


async def test_a_burst_of_sends_is_one_turn(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])
    for text in ("a", "b", "c"):
        agent.send([text_block(text)])
    await asyncio.wait_for(agent.when_idle(), 5)
    assert kinds(agent)[:4] == ["turn_start", "user_message", "user_message", "user_message"]
    assert kinds(agent).count("turn_start") == 1


async def test_model_error_finish_fails_the_turn_once_with_its_code(harness: Harness) -> None:
    agent = await harness.create(
        script=[
            scripted_pb2.ScriptedStep(finish=ERROR, error_message="overloaded", error_code="E42")
        ]
    )
    await harness.turn(agent, "go")
    k = kinds(agent)
    assert "assistant_message" not in k
    assert k[-3:] == ["assistant_chunk", "step_end", "turn_end"]
    error = turn_ends(agent)[0].error
    assert (error.step, error.message, error.code) == (1, "overloaded", "E42")
    errors = [e.error for e in harness.agent_events["a1"] if e.HasField("error")]
    assert [(e.turn, e.step) for e in errors] == [(1, 1)]


async def test_model_aborted_finish_without_cancel_is_an_error(harness: Harness) -> None:
    from agentloop.v1 import stream_pb2 as st

    agent = await harness.create(script=[scripted_pb2.ScriptedStep(finish=st.FINISH_KIND_ABORTED)])
    await harness.turn(agent, "go")
    error = turn_ends(agent)[0].error
    assert (error.message, error.code) == ("model stream aborted", "ABORTED")


async def test_error_without_code_leaves_code_empty(harness: Harness) -> None:
    agent = await harness.create(
        script=[scripted_pb2.ScriptedStep(finish=ERROR, error_message="x")]
    )
    await harness.turn(agent, "go")
    assert turn_ends(agent)[0].error.code == ""


async def test_model_less_agent_fails_clearly_and_request_can_supply_it(harness: Harness) -> None:
    harness.runtime.models.register("bare", harness.model)  # a provider with no default model
    agent = await harness.create(provider="bare", model="", script=[text_step("ok")])
    await harness.turn(agent, "go")
    error = turn_ends(agent)[0].error
    assert error.code == "NO_MODEL" and 'agent "a1" has no provider/model' in error.message

    async def supply(call: S.Request, next_: object) -> c.ModelConfig:
        return c.ModelConfig(provider="bare", model="supplied")

    harness.runtime.seams.on(S.REQUEST, supply)
    await harness.turn(agent, "again")
    assert reason_kinds(agent) == ["error", "completed"]


async def test_step_result_rewrite_is_what_log_history_and_tools_see(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("original"), text_step("after tool")],
                                 tools=["word_count"])  # fmt: skip
    rewritten = [text_block("rewritten"), c.ContentBlock(tool_call=c.ToolCallBlock(
        id="r1", name="word_count", arguments='{"text": "x y"}'))]  # fmt: skip

    async def step_result(call: S.StepResult, next_: S.Next[S.StepResult, c.Message]) -> c.Message:
        if call.step == 1:
            return c.Message(role=c.ROLE_ASSISTANT, content=rewritten)
        return await next_()

    harness.runtime.seams.on(S.STEP_RESULT, step_result)
    await harness.turn(agent, "go")
    message = next(e for e in agent.session.events if e.HasField("assistant_message"))
    assert list(message.assistant_message.content) == rewritten
    call = next(e for e in agent.session.events if e.HasField("tool_call"))
    assert call.tool_call.call_id == "r1"
    history = agent.session.derive_messages()
    assert plain_text(history[1].content) == "rewritten"


async def test_throwing_step_result_records_one_empty_anchor(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("abc", usage=USAGE)])

    def boom(*args: object) -> c.Message:
        raise RuntimeError("step-result broke")

    harness.runtime.seams.on(S.STEP_RESULT, boom)
    await harness.turn(agent, "go")
    anchors = [e for e in agent.session.events if e.HasField("assistant_message")]
    assert len(anchors) == 1
    assert list(anchors[0].assistant_message.content) == []
    assert anchors[0].assistant_message.usage == USAGE
    chunk_seqs = [e.seq for e in agent.session.events if e.HasField("assistant_chunk")]
    assert list(anchors[0].source_event_seqs) == chunk_seqs
    assert [m.role for m in agent.session.derive_messages()] == [c.ROLE_USER]
    error = turn_ends(agent)[0].error
    assert error.step == 1 and "step-result broke" in error.message


async def test_abort_inside_a_tool_stops_the_batch_and_the_turn(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("sleep", '{"seconds": 5}'), ("word_count", '{"text": "a"}'))],
        tools=["sleep", "word_count"],
        max_parallel_tool_calls=1,
    )

    def cancel_on_call(event: ev.SessionEvent) -> None:
        if event.HasField("tool_call"):
            asyncio.get_running_loop().call_later(0.05, agent.cancel, "user interrupt")

    agent.session.observers.append(cancel_on_call)
    await harness.turn(agent, "go")
    calls = [e.tool_call.call_id for e in agent.session.events if e.HasField("tool_call")]
    results = [e.tool_result.call_id for e in agent.session.events if e.HasField("tool_result")]
    assert calls == ["c1"] and results == ["c1"]
    assert turn_ends(agent)[0].aborted.reason == "user interrupt"
    assert len(harness.model.requests) == 1
    assert kinds(agent)[-3:] == ["tool_result", "step_end", "turn_end"]


async def test_dispose_mid_turn_ends_disposed(harness: Harness) -> None:
    delay = duration_pb2.Duration(nanos=20_000_000)
    agent = await harness.create(script=[text_step("slow answer", chunk_delay=delay)])
    agent.send([text_block("go")])
    await agent.session.wait_beyond(4)
    await harness.factory.dispose("a1")
    assert reason_kinds(agent) == ["disposed"]
    assert harness.status_traces["a1"][-1] == ae.AGENT_STATUS_DISPOSED
    disposed = [e for e in harness.agent_events["a1"] if e.HasField("disposed")]
    assert len(disposed) == 1


async def test_observers_that_throw_are_contained(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("ok")])

    def boom(event: ev.SessionEvent) -> None:
        if event.WhichOneof("payload") in ("turn_start", "step_start", "step_end", "turn_end"):
            raise RuntimeError("observer broke")

    def status_boom(*args: object) -> None:
        raise RuntimeError("status listener broke")

    agent.session.observers.append(boom)
    harness.runtime.seams.on(S.STATUS, status_boom)
    await harness.turn(agent, "go")
    assert boundaries(agent) == ["turn_start", "step_start", "step_end", "turn_end"]
    assert reason_kinds(agent) == ["completed"]
    assert agent.session.observer_failures == 4


async def test_steer_from_turn_end_observer_becomes_the_next_turn(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    steered: list[int] = []

    def on_turn_end(event: ev.SessionEvent) -> None:
        if event.HasField("turn_end") and not steered:
            steered.append(1)
            agent.steer([text_block("late")])

    agent.session.observers.append(on_turn_end)
    await harness.turn(agent, "go")
    assert kinds(agent).count("turn_start") == 2
    second_prompt = [e for e in agent.session.events if e.HasField("user_message")][1]
    assert plain_text(second_prompt.user_message.content) == "late"


async def test_steer_from_step_end_observer_runs_another_step(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    steered: list[int] = []

    def on_step_end(event: ev.SessionEvent) -> None:
        if event.HasField("step_end") and not steered:
            steered.append(1)
            agent.steer([text_block("more")])

    agent.session.observers.append(on_step_end)
    await harness.turn(agent, "go")
    k = kinds(agent)
    assert k.count("turn_start") == 1 and k.count("step_start") == 2
    assert k.index("steering_message") < len(k) - k[::-1].index("step_start") - 1


async def test_session_start_fires_once_and_can_seed_context(harness: Harness) -> None:
    seen: list[object] = []

    def on_start(started: S.SessionStarted) -> None:
        seen.append(started.source)
        started.agent.inject(ctx("seeded"))

    harness.runtime.seams.on(S.SESSION_START, on_start)
    agent = await harness.create(script=[text_step("ok")])
    await harness.turn(agent, "hi")
    assert seen == [ae.SESSION_START_SOURCE_STARTUP]
    assert "seeded" in all_text(list(harness.model.requests[0].messages))


async def test_session_prefix_is_composed_once_and_fronts_every_request(harness: Harness) -> None:
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    composed: list[int] = []
    prefix_message = c.Message(role=c.ROLE_USER, content=[text_block("PREFIX")])

    async def prefix(
        call: S.SessionPrefix, next_: S.Next[S.SessionPrefix, list[c.Message]]
    ) -> list[c.Message]:
        composed.append(1)
        return [prefix_message, *(await next_())]

    harness.runtime.seams.on(S.SESSION_PREFIX, prefix)
    await harness.turn(agent, "first")
    await harness.turn(agent, "second")
    assert composed == [1]
    for request in harness.model.requests:
        assert plain_text(request.messages[0].content) == "PREFIX"
    header = next(e for e in agent.session.events if e.HasField("request_header"))
    assert plain_text(header.request_header.header.message_prefix[0].content) == "PREFIX"
    assert all(plain_text(m.content) != "PREFIX" for m in agent.session.derive_messages())


async def test_system_prompt_renders_identity_persona_and_variables(harness: Harness) -> None:
    agent = await harness.create(
        script=[text_step("ok")], persona="Model {{model}} in {{cwd}}.", cwd="/srv/work"
    )
    await harness.turn(agent, "hi")
    system = harness.model.requests[0].header.system
    identity, persona = system.split("\n\n")
    assert identity.startswith("You are an AI agent")
    assert persona == "Model test-model in /srv/work."


async def test_strict_variable_failure_is_a_turn_error_and_the_loop_survives(
    harness: Harness,
) -> None:
    # A persona is checked at creation; a section added later can still fail at render.
    agent = await harness.create(script=[text_step("ok")])
    agent.runtime.prompts.add_section(Section("late", 1, "In {{cwd}}."), agent.agent_id)
    await harness.turn(agent, "hi")
    assert harness.model.requests == []
    assert "no value for this assembly" in turn_ends(agent)[0].error.message
    assert "step_start" not in kinds(agent)


async def test_every_request_rebuilds_from_the_log(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text":"a b"}')), text_step("one"), text_step("two")],
        tools=["word_count"],
    )
    await harness.turn(agent, "first")
    agent.inject(ctx("between"))
    await harness.turn(agent, "second")
    events = agent.session.events
    step_starts = [e.seq for e in events if e.HasField("step_start")]
    assert len(step_starts) == len(harness.model.requests) == 3
    from server.sessions.session import SessionLog

    for request, seq in zip(harness.model.requests, step_starts, strict=True):
        replay = SessionLog("replay", agent.session.header, seed=events[: seq - 1])
        rebuilt = [*request.header.message_prefix, *replay.derive_messages()]
        assert list(request.messages) == rebuilt
        header_log = SessionLog("replay", agent.session.header, seed=events[: seq + 1])
        assert header_log.request_header == request.header


async def test_a_running_turn_and_step_are_owned_by_the_loop_state(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text": "a"}')), text_step("ok")], tools=["word_count"]
    )
    seen: list[tuple[int, int, bool]] = []

    def pre_step(call: S.PreStep) -> None:
        turn = cast(Agent, call.agent).loop.turn
        assert turn is not None and turn.current is not None
        seen.append((turn.number, turn.current.number, turn.current.signal is call.signal))

    harness.runtime.seams.on(S.PRE_STEP, pre_step)
    await harness.turn(agent, "go")
    assert seen == [(1, 1, True), (1, 2, True)]
    # Between turns nothing runs; what the loop instance keeps (its requests) stays.
    assert agent.loop.turn is None and agent.loop.cancel_reason is None
    assert agent.loop.requests_made == 2
