"""The Python plugin helper, driven as the loop drives a plugin: Describe, then Handle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, json_format

from agentloop.plugin import sdk
from agentloop.plugin.service import CallStream
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.plugin.v1 import hook_service_pb2_grpc
from agentloop.v1 import agent_event_pb2, content_pb2, decision_pb2, session_event_pb2
from tests.plugin_client import HandleStream, PluginLoop, T, hook_client, load_example, looping
from tests.processes import guard_example, plugin_launcher


def text(value: str) -> content_pb2.ContentBlock:
    return content_pb2.ContentBlock(text=content_pb2.TextBlock(text=value))


def prompt(call_id: str, value: str) -> hs.HookCall:
    return hs.HookCall(
        call_id=call_id,
        seam=hs.SEAM_PROMPT_SUBMIT,
        agent_id="a1",
        turn=1,
        prompt_submit=hs.PromptSubmitCall(content=[text(value)]),
    )


def tool_call(call_id: str, name: str, arguments: str) -> hs.HookCall:
    invocation = hs.ToolInvocation(call_id="m-" + call_id, name=name, arguments=arguments)
    return hs.HookCall(
        call_id=call_id,
        kind=hs.CALL_KIND_TOOL_EXECUTE,
        tool_execute=hs.ToolExecuteCall(invocation=invocation),
    )


def pre_tool(call_id: str, name: str) -> hs.HookCall:
    invocation = hs.ToolInvocation(call_id="m-" + call_id, name=name, arguments="{}")
    return hs.HookCall(
        call_id=call_id,
        seam=hs.SEAM_TOOLS_PRE_EXECUTE,
        tool_pre_execute=hs.ToolPreExecuteCall(invocation=invocation),
    )


@dataclass
class Probe:
    """What the extra handlers of the test plugin saw and did."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    events: list[int] = field(default_factory=list)
    agent_events: list[str] = field(default_factory=list)


def build_plugin(token: str | None = None) -> tuple[sdk.Plugin, Probe]:
    """The example plugin plus handlers on other seams: gated, slow, raising, observing."""
    plugin: sdk.Plugin = load_example("guard_plugin.py").build_plugin(token)
    probe = Probe()

    @plugin.step_result()
    async def gated(call: hs.HookCall) -> hs.StepResultResult:
        await probe.gate.wait()  # opened by the turn_stop handler: needs concurrency
        return sdk.replace_message("rewritten")

    @plugin.turn_stop()
    async def opener(call: hs.HookCall) -> hs.TurnStopResult:
        probe.gate.set()
        return sdk.terminal_stop()

    @plugin.pre_step(order=-5, timeout=2.5)
    async def slow(call: hs.HookCall) -> hs.PreStepResult:
        probe.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            probe.cancelled.set()
            raise
        return sdk.add_context("never")

    @plugin.tools_pre_execute(order=20, failure_policy=sdk.FAIL_OPEN, agent_ids=["a1", "a2"])
    async def check(call: hs.HookCall) -> decision_pb2.PreToolDecision | None:
        name = call.tool_pre_execute.invocation.name
        if name == "boom":
            raise RuntimeError("boom is not allowed to run")
        if name == "wrong":
            return sdk.stop_turn()  # type: ignore[return-value]  # deliberately malformed
        return sdk.deny("no deletes") if name == "delete" else None

    @plugin.turn_continuation()
    async def keep_going(call: hs.HookCall) -> decision_pb2.ContinuationDecision:
        return sdk.continue_turn("one more step")

    @plugin.on_session_event()
    async def record(call: hs.HookCall) -> None:
        probe.events.append(call.session_event.event.seq)

    @plugin.on_agent_event()
    async def fail(call: hs.HookCall) -> None:
        probe.agent_events.append(call.agent_event.event.agent_id)
        raise RuntimeError("observers' failures are only logged")

    return plugin, probe


Loop = PluginLoop[Probe]


@pytest.fixture
async def loop() -> AsyncIterator[Loop]:
    async with looping(*build_plugin()) as running:
        yield running


async def test_describe_reports_subscriptions_and_tools(loop: Loop) -> None:
    described = await loop.stub.Describe(hs.DescribeRequest(), timeout=T)
    assert (described.name, described.version) == ("guard", "1.0")
    subs = {s.seam: s for s in described.subscriptions}
    assert [s.seam for s in described.subscriptions] == sorted(subs)  # seam order
    assert set(subs) == {
        hs.SEAM_PROMPT_SUBMIT,
        hs.SEAM_PRE_STEP,
        hs.SEAM_STEP_RESULT,
        hs.SEAM_TURN_CONTINUATION,
        hs.SEAM_TURN_STOP,
        hs.SEAM_TOOLS_PRE_EXECUTE,
        hs.SEAM_SESSION_EVENTS,
        hs.SEAM_AGENT_EVENTS,
    }
    assert subs[hs.SEAM_PROMPT_SUBMIT].order == 10
    assert subs[hs.SEAM_PRE_STEP].order == -5
    assert subs[hs.SEAM_PRE_STEP].timeout == duration_pb2.Duration(seconds=2, nanos=500_000_000)
    assert not subs[hs.SEAM_PROMPT_SUBMIT].HasField("timeout")
    pre_tool_sub = subs[hs.SEAM_TOOLS_PRE_EXECUTE]
    assert pre_tool_sub.failure_policy == hs.FAILURE_POLICY_FAIL_OPEN
    assert list(pre_tool_sub.agent_ids) == ["a1", "a2"]
    assert subs[hs.SEAM_STEP_RESULT].failure_policy == hs.FAILURE_POLICY_UNSPECIFIED
    [shout] = described.tools
    assert (shout.name, shout.description, shout.parallel_safe) == (
        "shout",
        "Upper-cases text.",
        True,
    )
    example = load_example("guard_plugin.py")
    assert json_format.MessageToDict(shout.input_schema) == example.SHOUT_SCHEMA


async def test_concurrent_calls_are_answered_as_they_finish(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    step_result = hs.HookCall(
        call_id="c1",
        seam=hs.SEAM_STEP_RESULT,
        step_result=hs.StepResultCall(message=content_pb2.Message(content=[text("original")])),
    )
    turn_stop = hs.HookCall(call_id="c2", seam=hs.SEAM_TURN_STOP, turn_stop=hs.TurnStopCall())
    # c1 waits for a gate only c2 opens: served one at a time, this would never finish.
    await stream.send(
        step_result,
        turn_stop,
        prompt("c3", "please rm -rf /"),
        prompt("c4", "hello"),
        tool_call("c5", "shout", '{"text": "hi there"}'),
        pre_tool("c6", "delete"),
        pre_tool("c7", "read"),
        hs.HookCall(
            call_id="c8",
            seam=hs.SEAM_TURN_CONTINUATION,
            turn_continuation=hs.TurnContinuationCall(),
        ),
    )
    results = {}
    order = []
    for _ in range(8):
        result = await stream.result()
        assert result.call_id not in results
        results[result.call_id] = result
        order.append(result.call_id)
    assert order.index("c2") < order.index("c1")
    assert all(not r.HasField("error") for r in results.values()), results
    assert results["c1"].step_result.message.content[0].text.text == "rewritten"
    assert results["c1"].step_result.message.role == content_pb2.ROLE_ASSISTANT
    assert results["c2"].turn_stop.stop
    assert results["c3"].prompt_submit.block.reason == "destructive command"
    allow = results["c4"].prompt_submit.allow
    assert not allow.content  # the prompt is kept as it is
    [note] = allow.additional_contexts
    assert "The plugin's clock reads" in sdk.text_of(note.content)
    assert (note.source.kind, note.source.name) == ("plugin", "guard")
    assert results["c5"].tool_execute.content[0].text.text == "HI THERE"
    assert not results["c5"].tool_execute.is_error
    assert results["c6"].tool_pre_execute.deny.reason == "no deletes"
    assert results["c7"].WhichOneof("outcome") is None  # continue unchanged
    assert results["c8"].turn_continuation.continue_turn.reason[0].text.text == "one more step"
    assert await stream.finish() == []


async def test_many_calls_in_flight_are_each_answered_once() -> None:
    plugin = sdk.Plugin("many")
    in_flight = 0
    peak = 0

    @plugin.tool("echo", parallel_safe=True)
    async def echo(args: Any, call: hs.HookCall) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(args["delay"])
        in_flight -= 1
        return {"n": args["n"]}

    async with hook_client(plugin) as stub:
        stream = HandleStream(stub)
        count = 300
        await stream.send(
            *[
                tool_call(f"e{n}", "echo", f'{{"n": {n}, "delay": {(n * 7919) % 50 / 1000}}}')
                for n in range(count)
            ]
        )
        results = [await stream.result() for _ in range(count)]
        assert sorted(r.call_id for r in results) == sorted(f"e{n}" for n in range(count))
        for r in results:
            assert sdk.text_of(r.tool_execute.content) == f'{{"n": {r.call_id[1:]}}}'
        assert peak > 10  # really concurrent
        assert await stream.finish() == []


async def test_cancel_call_cancels_the_handler_and_sends_no_result(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    slow = hs.HookCall(call_id="slow", seam=hs.SEAM_PRE_STEP, pre_step=hs.PreStepCall())
    await stream.send(slow)
    async with asyncio.timeout(T):
        await loop.probe.started.wait()
    await stream.cancel("slow")
    async with asyncio.timeout(T):
        await loop.probe.cancelled.wait()
    await stream.cancel("unknown")  # a cancel for a call already answered is ignored
    await stream.send(prompt("after", "hello"))
    assert (await stream.result()).call_id == "after"
    assert await stream.finish() == []


async def test_a_call_past_its_deadline_is_cancelled_and_not_answered(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    call = hs.HookCall(
        call_id="late",
        seam=hs.SEAM_PRE_STEP,
        pre_step=hs.PreStepCall(),
        timeout=duration_pb2.Duration(nanos=100_000_000),
    )
    await stream.send(call)
    async with asyncio.timeout(T):
        await loop.probe.cancelled.wait()
    assert await stream.finish() == []


async def test_failures_are_answered_with_error(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    await stream.send(
        pre_tool("boom", "boom"),
        pre_tool("wrong", "wrong"),
        tool_call("missing", "no_such_tool", "{}"),
        hs.HookCall(call_id="unsubscribed", session_prefix=hs.SessionPrefixCall()),
        hs.HookCall(call_id="empty"),
    )
    results = {r.call_id: r for r in [await stream.result() for _ in range(5)]}
    assert results["boom"].error.message == "boom is not allowed to run"
    wrong = "returned ContinuationDecision, not PreToolDecision"
    assert wrong in results["wrong"].error.message
    assert "no tool 'no_such_tool'" in results["missing"].error.message
    assert "no handler for session_prefix" in results["unsubscribed"].error.message
    assert "no handler" in results["empty"].error.message
    # A call it does not know is UNIMPLEMENTED (12); a handler's failure UNKNOWN (2).
    assert results["unsubscribed"].error.code == results["empty"].error.code == 12
    assert results["boom"].error.code == 2
    assert all(r.WhichOneof("outcome") == "error" for r in results.values())
    # Arguments that are not JSON are the model's mistake: a tool error it sees.
    await stream.send(tool_call("bad-json", "shout", "{not json"))
    bad = await stream.result()
    assert not bad.HasField("error") and bad.tool_execute.is_error
    assert bad.tool_execute.error.code == "INVALID_ARGUMENTS"
    assert sdk.text_of(bad.tool_execute.content).startswith("Error: invalid JSON arguments")
    assert await stream.finish() == []


async def test_notifications_get_no_result(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    event = session_event_pb2.SessionEvent(seq=7)
    await stream.send(
        hs.HookCall(call_id="n1", session_event=hs.SessionEventNotice(event=event)),
        hs.HookCall(
            call_id="n2",
            agent_event=hs.AgentEventNotice(event=agent_event_pb2.AgentEvent(agent_id="a1")),
        ),
        hs.HookCall(call_id="n3", tool_result=hs.ToolResultNotice()),  # not subscribed
        prompt("p", "hello"),
    )
    assert (await stream.result()).call_id == "p"
    assert await stream.finish() == []
    assert loop.probe.events == [7]
    assert loop.probe.agent_events == ["a1"]


async def test_stop_answers_the_calls_in_flight_then_ends_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin = sdk.Plugin("drain")
    started, draining, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    drain = CallStream.drain

    def drain_and_tell(stream: CallStream) -> None:
        drain(stream)
        draining.set()

    monkeypatch.setattr(CallStream, "drain", drain_and_tell)

    @plugin.turn_stop()
    async def wait(call: hs.HookCall) -> hs.TurnStopResult:
        started.set()
        await release.wait()
        return sdk.terminal_stop()

    async with hook_client(plugin) as stub:
        stream = HandleStream(stub)
        await stream.send(hs.HookCall(call_id="t", turn_stop=hs.TurnStopCall()))
        async with asyncio.timeout(T):
            await started.wait()  # the call is in flight ...
        stopping = asyncio.create_task(plugin.stop(grace=T))
        async with asyncio.timeout(T):
            await draining.wait()  # ... when the stop begins: it is still answered
        release.set()
        result = await stream.result()
        assert (result.call_id, result.turn_stop.stop) == ("t", True)
        async with asyncio.timeout(T):
            assert await stream.call.read() is grpc.aio.EOF
            await stopping


async def test_token_is_required_when_configured() -> None:
    plugin, _ = build_plugin(token="s3cret")
    async with hook_client(plugin) as stub:
        for metadata in [None, (("authorization", "Bearer wrong"),)]:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.Describe(hs.DescribeRequest(), metadata=metadata, timeout=T)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stream = HandleStream(stub, metadata)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stream.result()
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        good = (("authorization", "Bearer s3cret"),)
        described = await stub.Describe(hs.DescribeRequest(), metadata=good, timeout=T)
        assert described.name == "guard"
        stream = HandleStream(stub, good)
        await stream.send(prompt("p", "hi"))
        assert (await stream.result()).call_id == "p"
        assert await stream.finish() == []


def test_registrations_are_checked() -> None:
    with pytest.raises(ValueError, match="plugin name"):
        sdk.Plugin("no spaces")
    plugin = sdk.Plugin("p")

    async def handler(call: hs.HookCall) -> None:
        return None

    plugin.on_tool_result()(handler)
    with pytest.raises(ValueError, match="already has a tool_result handler"):
        plugin.on_tool_result(order=3)(handler)


def test_decision_constructors() -> None:
    allow = sdk.allow_prompt("new text", contexts=["note"]).allow
    assert sdk.text_of(allow.content) == "new text"
    assert allow.additional_contexts[0].source.kind == "plugin"
    assert sdk.ask("sure?").ask.reason == "sure?"
    assert sdk.allow_tool().WhichOneof("decision") == "allow"
    assert sdk.accept("x").accept.content[0].text.text == "x"
    assert sdk.block_result("nope").block.feedback == "nope"
    assert sdk.stop_turn().WhichOneof("decision") == "stop"
    assert not sdk.continue_turn().continue_turn.reason
    base = content_pb2.ModelConfig(provider="p", model="m", stop=["a"])
    config = sdk.replace_config(base, temperature=0.5, stop=["b"]).config
    assert (config.provider, config.model, config.temperature, list(config.stop)) == (
        "p",
        "m",
        0.5,
        ["b"],
    )
    assert sdk.add_context("hi", source="clock").contexts[0].source.kind == "clock"
    prefix = sdk.replace_prefix([content_pb2.Message(role=content_pb2.ROLE_USER)]).prefix
    assert len(prefix) == 1
    output = sdk.tool_output("done", meta={"n": 1})
    assert json_format.MessageToDict(output.meta) == {"n": 1.0}
    assert sdk.tool_error("bad", code="E").error.code == "E"


async def test_the_example_runs_as_a_process(tmp_path: Path) -> None:
    async with plugin_launcher(tmp_path) as launcher:
        plugin = await launcher.start(guard_example("python"))
        assert plugin.name == "guard" and plugin.address.startswith("127.0.0.1:"), plugin
        async with grpc.aio.insecure_channel(plugin.address) as channel:
            stub = hook_service_pb2_grpc.HookServiceStub(channel)
            described = await stub.Describe(hs.DescribeRequest(), timeout=T)
            assert [t.name for t in described.tools] == ["shout"]
        assert await plugin.terminate() == 0
