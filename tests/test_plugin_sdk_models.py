"""Model providers of the Python plugin helper, driven as the loop drives them over `Handle`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.protobuf import duration_pb2

from agentloop.plugin import sdk
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import content_pb2, stream_pb2
from tests.plugin_client import HandleStream, PluginLoop, T, load_example, looping


def user(value: str) -> content_pb2.Message:
    return content_pb2.Message(
        role=content_pb2.ROLE_USER,
        content=[content_pb2.ContentBlock(text=content_pb2.TextBlock(text=value))],
    )


def model_call(
    call_id: str,
    provider: str,
    *messages: content_pb2.Message,
    model: str = "",
    tools: tuple[str, ...] = (),
    timeout: float | None = None,
) -> hs.HookCall:
    header = content_pb2.RequestHeader(
        config=content_pb2.ModelConfig(provider=provider, model=model),
        tools=[content_pb2.ToolSchema(name=name) for name in tools],
    )
    call = hs.HookCall(
        call_id=call_id,
        kind=hs.CALL_KIND_MODEL_STREAM,
        agent_id="a1",
        turn=1,
        step=1,
        model_stream=hs.ModelStreamCall(provider=provider, header=header, messages=messages),
    )
    if timeout is not None:
        call.timeout.FromNanoseconds(int(timeout * 1e9))
    return call


def kind(chunk: stream_pb2.StreamChunk) -> str:
    return str(chunk.WhichOneof("chunk"))


def text_of_chunks(chunks: list[stream_pb2.StreamChunk]) -> str:
    return "".join(c.block_delta.text for c in chunks if c.HasField("block_delta"))


@dataclass
class Probe:
    """What the test plugin's models saw and did."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)


def build_plugin() -> tuple[sdk.Plugin, Probe]:
    """A plugin serving one provider per behaviour under test."""
    plugin = sdk.Plugin("models", version="2.0")
    probe = Probe()

    @plugin.model("full", default_model="m1", timeout=2.5)
    async def full(call: hs.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
        for chunk in sdk.text_chunks("thinking", kind=sdk.REASONING, chunk_size=4):
            yield chunk
        for chunk in sdk.text_chunks("hello world", index=1, chunk_size=5):
            yield chunk
        for chunk in sdk.tool_call_chunks("call_1", "lookup", {"q": "x"}, index=2):
            yield chunk
        yield sdk.usage_chunk(input_tokens=3, output_tokens=4)
        yield sdk.finish_chunk()
        probe.closed.set()  # never reached: the finish ends the stream
        yield sdk.finish_chunk()

    @plugin.model("open-ended")
    async def open_ended(call: hs.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
        for chunk in sdk.text_chunks(sdk.last_user_text(call.model_stream.messages)):
            yield chunk

    @plugin.model("plain")
    async def plain(call: hs.HookCall) -> str:
        return f"model {call.model_stream.header.config.model}"

    @plugin.model("listed")
    async def listed(call: hs.HookCall) -> list[stream_pb2.StreamChunk]:
        return [*sdk.text_chunks("out of tokens"), sdk.finish_chunk(sdk.MAX_TOKENS)]

    @plugin.model("boom")
    async def boom(call: hs.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
        yield sdk.text_chunks("partial")[0]
        raise RuntimeError("the model broke")

    @plugin.model("upstream")
    async def upstream(call: hs.HookCall) -> str:
        raise TimeoutError("the upstream API timed out")  # not the call's deadline

    @plugin.model("bad")
    async def bad(call: hs.HookCall) -> AsyncIterator[Any]:
        yield "not a chunk"

    @plugin.model("slow")
    async def slow(call: hs.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
        try:
            yield sdk.text_chunks("first")[0]
            probe.started.set()
            await asyncio.sleep(3600)
            yield sdk.finish_chunk()
        finally:
            probe.closed.set()

    @plugin.model("ticker")
    async def ticker(call: hs.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
        yield sdk.text_chunks("tick")[0]
        try:
            while True:  # endless: only a CancelCall stops it
                yield stream_pb2.StreamChunk(block_delta=stream_pb2.BlockDelta(text="tick"))
                probe.started.set()
                await asyncio.sleep(0.005)
        finally:
            probe.closed.set()

    @plugin.model("gated")
    async def gated(call: hs.HookCall) -> AsyncIterator[stream_pb2.StreamChunk]:
        for chunk in sdk.text_chunks("abcdef", chunk_size=2):
            yield chunk
            await probe.gate.wait()  # opened by the "opener" model: needs concurrency
        yield sdk.finish_chunk()

    @plugin.model("opener")
    async def opener(call: hs.HookCall) -> str:
        probe.gate.set()
        return "opened"

    @plugin.turn_stop()
    async def stop(call: hs.HookCall) -> hs.TurnStopResult:
        return sdk.terminal_stop()

    return plugin, probe


Loop = PluginLoop[Probe]


@pytest.fixture
async def loop() -> AsyncIterator[Loop]:
    async with looping(*build_plugin()) as running:
        yield running


async def test_describe_lists_the_models(loop: Loop) -> None:
    described = await loop.stub.Describe(hs.DescribeRequest(), timeout=T)
    assert (described.name, described.version) == ("models", "2.0")
    names = [m.provider for m in described.models]
    assert names == [
        *["full", "open-ended", "plain", "listed", "boom", "upstream", "bad", "slow", "ticker"],
        *["gated", "opener"],
    ]
    full = described.models[0]
    assert full.default_model == "m1"
    assert full.timeout == duration_pb2.Duration(seconds=2, nanos=500_000_000)
    assert not described.models[1].HasField("timeout")
    assert described.models[1].default_model == ""
    assert [s.seam for s in described.subscriptions] == [hs.SEAM_TURN_STOP]


async def test_a_model_call_streams_its_chunks_in_order_up_to_the_finish(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    await stream.send(model_call("m1", "full", user("hi")))
    chunks = await stream.chunks("m1")
    assert [kind(c) for c in chunks] == (
        ["block_start", "block_delta", "block_delta", "block_end"]  # reasoning
        + ["block_start", "block_delta", "block_delta", "block_delta", "block_end"]  # text
        + ["block_start", "block_delta", "block_end"]  # tool call
        + ["usage", "finish"]
    )
    assert chunks[0].block_start == stream_pb2.BlockStart(index=0, kind=sdk.REASONING)
    assert [c.block_delta.text for c in chunks[5:8]] == ["hello", " worl", "d"]
    assert {c.block_delta.index for c in chunks[5:8]} == {1}
    tool = chunks[9].block_start
    assert (tool.index, tool.kind, tool.tool_call_id, tool.tool_name) == (
        2,
        stream_pb2.BLOCK_KIND_TOOL_CALL,
        "call_1",
        "lookup",
    )
    assert chunks[10].block_delta.text == '{"q": "x"}'
    assert chunks[12].usage == content_pb2.Usage(input_tokens=3, output_tokens=4)
    assert chunks[13].finish == stream_pb2.Finish(kind=sdk.STOP)
    assert await stream.finish() == []  # nothing after the finish
    assert not loop.probe.closed.is_set()


async def test_a_missing_finish_is_appended_and_plain_handlers_are_wrapped(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    await stream.send(model_call("m1", "open-ended", user("say this")))
    chunks = await stream.chunks("m1")
    assert text_of_chunks(chunks) == "say this"
    assert [kind(c) for c in chunks[-2:]] == ["block_end", "finish"]
    assert chunks[-1].finish.kind == sdk.STOP
    await stream.send(model_call("m2", "plain", model="tiny"))
    chunks = await stream.chunks("m2")
    assert text_of_chunks(chunks) == "model tiny"
    assert chunks[0].block_start.kind == sdk.TEXT
    await stream.send(model_call("m3", "listed"))
    chunks = await stream.chunks("m3")
    assert text_of_chunks(chunks) == "out of tokens"
    assert chunks[-1].finish.kind == sdk.MAX_TOKENS
    assert await stream.finish() == []


async def test_a_failing_model_answers_an_error_result(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    await stream.send(model_call("m1", "boom"))
    first = await stream.response()
    assert (first.chunk.call_id, kind(first.chunk.chunk)) == ("m1", "block_start")
    failed = await stream.response()
    assert failed.result == hs.HookResult(
        call_id="m1", error=hs.CallError(code=2, message="the model broke")
    )
    await stream.send(model_call("m2", "bad"))
    bad = await stream.response()
    assert bad.result.call_id == "m2"
    assert "produced 'not a chunk', not a StreamChunk" in bad.result.error.message
    await stream.send(model_call("m3", "unknown"))
    unknown = await stream.response()
    assert unknown.result.error.message == "plugin models serves no model provider 'unknown'"
    await stream.send(model_call("m4", "upstream", timeout=T))
    upstream = await stream.response()
    assert upstream.result == hs.HookResult(
        call_id="m4", error=hs.CallError(code=2, message="the upstream API timed out")
    )
    assert await stream.finish() == []


@pytest.mark.parametrize("provider", ["slow", "ticker"])
async def test_cancel_call_stops_the_chunks_and_closes_the_generator(
    loop: Loop, provider: str
) -> None:
    stream = HandleStream(loop.stub)
    await stream.send(model_call("m1", provider))
    first = await stream.response()
    assert (first.chunk.call_id, kind(first.chunk.chunk)) == ("m1", "block_start")
    async with asyncio.timeout(T):
        await loop.probe.started.wait()
    await stream.cancel("m1")
    async with asyncio.timeout(T):
        await loop.probe.closed.wait()
    await stream.send(hs.HookCall(call_id="after", turn_stop=hs.TurnStopCall()))
    while (after := await stream.response()).WhichOneof("kind") == "chunk":
        assert after.chunk.call_id == "m1"  # sent before the cancel arrived
        assert not after.chunk.chunk.HasField("finish")
    assert (after.result.call_id, after.result.turn_stop.stop) == ("after", True)
    assert await stream.finish() == []  # nothing more of the cancelled call


async def test_the_silence_deadline_withdraws_a_model_call(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    await stream.send(model_call("m1", "slow", timeout=0.2))
    first = await stream.response()
    assert first.chunk.call_id == "m1"
    async with asyncio.timeout(T):
        await loop.probe.closed.wait()
    assert await stream.finish() == []  # neither a finish nor an error


async def test_concurrent_model_calls_interleave_each_in_order(loop: Loop) -> None:
    stream = HandleStream(loop.stub)
    # "gated" waits after its first delta for a gate only "opener" opens.
    await stream.send(model_call("g", "gated"), model_call("o", "opener"))
    by_call: dict[str, list[stream_pb2.StreamChunk]] = {"g": [], "o": []}
    order = []
    while not all(chunks and chunks[-1].HasField("finish") for chunks in by_call.values()):
        response = await stream.response()
        by_call[response.chunk.call_id].append(response.chunk.chunk)
        order.append(response.chunk.call_id)
    assert order.index("o") < len(order) - order[::-1].index("g") - 1  # interleaved
    assert text_of_chunks(by_call["g"]) == "abcdef"
    assert text_of_chunks(by_call["o"]) == "opened"
    assert await stream.finish() == []


async def test_the_example_reverses_and_asks_for_the_time() -> None:
    plugin: sdk.Plugin = load_example("model_plugin.py").build_plugin()
    [model] = plugin.describe().models
    assert (model.provider, model.default_model) == ("plugin-echo", "reverse")

    async def chunks(call: hs.HookCall) -> list[stream_pb2.StreamChunk]:
        out = []
        async for response in plugin.responses(call):
            assert response.chunk.call_id == call.call_id, response
            out.append(response.chunk.chunk)
        return out

    reversed_ = await chunks(model_call("r", "plugin-echo", user("hello world"), model="reverse"))
    assert text_of_chunks(reversed_) == "dlrow olleh"
    assert [c.block_delta.text for c in reversed_ if c.HasField("block_delta")] == [
        "dlr",
        "ow ",
        "oll",
        "eh",
    ]
    assert reversed_[-1].finish.kind == sdk.STOP
    ask = user("What time is it?")
    asking = await chunks(
        model_call("t1", "plugin-echo", ask, model="reverse", tools=("current_time", "echo"))
    )
    start = asking[0].block_start
    assert (start.kind, start.tool_name, start.tool_call_id) == (
        stream_pb2.BLOCK_KIND_TOOL_CALL,
        "current_time",
        "time_1_1",
    )
    assert asking[-1].finish.kind == sdk.STOP
    result = content_pb2.Message(
        role=content_pb2.ROLE_USER,
        content=[
            content_pb2.ContentBlock(
                tool_result=content_pb2.ToolResultBlock(
                    tool_call_id="time_1_1",
                    content=[content_pb2.ContentBlock(text=content_pb2.TextBlock(text="12:00Z"))],
                )
            )
        ],
    )
    call = content_pb2.Message(role=content_pb2.ROLE_ASSISTANT)
    answer = await chunks(
        model_call("t2", "plugin-echo", ask, call, result, model="reverse", tools=("current_time",))
    )
    assert text_of_chunks(answer) == "It is 12:00Z"
    no_tool = await chunks(model_call("n", "plugin-echo", ask, model="reverse"))
    assert text_of_chunks(no_tool) == "?ti si emit tahW"
    other = await chunks(model_call("x", "plugin-echo", ask, model="forward"))
    assert other[-1].finish.kind == sdk.ERROR
    assert other[-1].finish.message == "unknown model 'forward'"


async def test_handle_points_model_calls_to_responses() -> None:
    plugin, _ = build_plugin()
    result = await plugin.handle(model_call("m", "plain"))
    assert result is not None and "use responses(call)" in result.error.message
    assert [r.result.call_id async for r in plugin.responses(hs.HookCall(call_id="s"))] == ["s"]


def test_registrations_are_checked() -> None:
    plugin = sdk.Plugin("p")

    async def handler(call: hs.HookCall) -> str:
        return ""

    plugin.model("one")(handler)
    with pytest.raises(ValueError, match="provider name 'one' empty or taken"):
        plugin.model("one")(handler)
    with pytest.raises(ValueError, match="provider name"):
        plugin.model("no spaces")


def test_chunk_helpers() -> None:
    assert sdk.text_chunks("") == []
    with pytest.raises(ValueError, match="chunk_size"):
        sdk.text_chunks("x", chunk_size=0)
    call = sdk.tool_call_chunks("c", "t")
    assert [kind(c) for c in call] == ["block_start", "block_end"]  # no arguments, no delta
    assert sdk.tool_call_chunks("c", "t", '{"a": 1}')[1].block_delta.text == '{"a": 1}'
    error = sdk.finish_chunk(sdk.ERROR, "overloaded", "503").finish
    assert (error.kind, error.message, error.code) == (sdk.ERROR, "overloaded", "503")
    assert sdk.usage_chunk(cached_input_tokens=2).usage.cached_input_tokens == 2
    assert sdk.last_user_text([user("a"), content_pb2.Message(role=content_pb2.ROLE_USER)]) == "a"
    assert sdk.last_user_text([]) == ""
