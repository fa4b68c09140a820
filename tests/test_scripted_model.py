"""Tests of the scripted model provider."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Sequence

import pytest
from google.protobuf import duration_pb2

from agentloop.v1 import agent_pb2, content_pb2, scripted_pb2, stream_pb2
from server.kernel.abort import NEVER, AbortController, AbortSignal
from server.kernel.assembly import MessageAssembler
from server.kernel.content import text_content
from server.kernel.errors import Aborted
from server.models import Model, ModelRequest
from server.models.scripted import COUNT_SLICE, GREETING, ScriptedModel
from server.models.scripted_options import script_options

S = stream_pb2
C = content_pb2


def user(text: str) -> C.Message:
    return C.Message(role=C.ROLE_USER, content=text_content(text))


def assistant(text: str) -> C.Message:
    return C.Message(role=C.ROLE_ASSISTANT, content=text_content(text))


def tool_results(*pairs: tuple[str, str]) -> C.Message:
    return C.Message(
        role=C.ROLE_USER,
        content=[
            C.ContentBlock(
                tool_result=C.ToolResultBlock(tool_call_id=call_id, content=text_content(text))
            )
            for call_id, text in pairs
        ],
    )


def request(
    messages: Sequence[C.Message] = (),
    script: Sequence[scripted_pb2.ScriptedStep] = (),
    tools: Sequence[str] = (),
    agent_id: str = "a1",
) -> ModelRequest:
    return ModelRequest(
        agent_id=agent_id,
        session_id=f"{agent_id}-session",
        turn=1,
        step=1,
        header=C.RequestHeader(
            config=C.ModelConfig(provider="scripted", model="test"),
            tools=[C.ToolSchema(name=n) for n in tools],
        ),
        messages=list(messages),
        options=agent_pb2.AgentOptions(
            provider="scripted", provider_options=script_options(script)
        ),
    )


async def collect(
    model: ScriptedModel, req: ModelRequest, signal: AbortSignal = NEVER
) -> list[S.StreamChunk]:
    return [chunk async for chunk in model.stream(req, signal)]


def kinds(chunks: list[S.StreamChunk]) -> list[str | None]:
    return [c.WhichOneof("chunk") for c in chunks]


def assembled(chunks: list[S.StreamChunk]) -> MessageAssembler:
    a = MessageAssembler()
    for chunk in chunks:
        a.add(chunk)
    return a


async def test_satisfies_the_model_protocol():
    # The signature the loop calls (by keyword too), and an async iterator of chunks.
    assert (
        list(inspect.signature(ScriptedModel().stream).parameters)
        == list(inspect.signature(Model.stream).parameters)[1:]
    )
    model: Model = ScriptedModel()
    stream = model.stream(request=request([user("hi")], []), signal=NEVER)
    assert isinstance(stream, AsyncIterator)
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(chunk, S.StreamChunk) for chunk in chunks)
    assert kinds(chunks)[-1] == "finish"


async def test_text_abc_gives_seven_chunks():
    step = scripted_pb2.ScriptedStep(text="abc", usage=C.Usage(input_tokens=10, output_tokens=3))
    chunks = await collect(ScriptedModel(), request([user("hi")], [step]))
    assert kinds(chunks) == [
        "block_start",
        "block_delta",
        "block_delta",
        "block_delta",
        "block_end",
        "usage",
        "finish",
    ]
    assert chunks[0].block_start == S.BlockStart(index=0, kind=S.BLOCK_KIND_TEXT)
    assert [c.block_delta.text for c in chunks[1:4]] == ["a", "b", "c"]
    assert chunks[5].usage == C.Usage(input_tokens=10, output_tokens=3)
    assert chunks[6].finish == S.Finish(kind=S.FINISH_KIND_STOP)


async def test_chunk_size_cuts_text_and_counts_code_points():
    step = scripted_pb2.ScriptedStep(text="héllo wörld", chunk_size=4)
    chunks = await collect(ScriptedModel(), request(script=[step]))
    assert [c.block_delta.text for c in chunks if c.HasField("block_delta")] == [
        "héll",
        "o wö",
        "rld",
    ]
    # No usage set, so none is reported.
    assert kinds(chunks)[-2:] == ["block_end", "finish"]


async def test_reasoning_text_and_tool_calls_in_order_with_indexes():
    step = scripted_pb2.ScriptedStep(
        reasoning="hm",
        text="ok",
        chunk_size=2,
        tool_calls=[
            scripted_pb2.ScriptedToolCall(name="read", arguments='{"path":"a"}'),
            scripted_pb2.ScriptedToolCall(id="mine", name="ping"),
        ],
    )
    chunks = await collect(ScriptedModel(), request(script=[step]))
    starts = [c.block_start for c in chunks if c.HasField("block_start")]
    assert starts == [
        S.BlockStart(index=0, kind=S.BLOCK_KIND_REASONING),
        S.BlockStart(index=1, kind=S.BLOCK_KIND_TEXT),
        S.BlockStart(
            index=2, kind=S.BLOCK_KIND_TOOL_CALL, tool_call_id="call_1_1", tool_name="read"
        ),
        S.BlockStart(index=3, kind=S.BLOCK_KIND_TOOL_CALL, tool_call_id="mine", tool_name="ping"),
    ]
    # Empty arguments give no delta: start and end only.
    assert kinds(chunks)[-3:] == ["block_start", "block_end", "finish"]
    content = assembled(chunks).content
    assert content[0].reasoning.text == "hm"
    assert content[1].text.text == "ok"
    assert content[2].tool_call == C.ToolCallBlock(
        id="call_1_1", name="read", arguments='{"path":"a"}'
    )
    assert content[3].tool_call == C.ToolCallBlock(id="mine", name="ping")


async def test_empty_step_is_just_a_stop_finish():
    chunks = await collect(ScriptedModel(), request(script=[scripted_pb2.ScriptedStep()]))
    assert kinds(chunks) == ["finish"]
    assert chunks[0].finish.kind == S.FINISH_KIND_STOP


@pytest.mark.parametrize(
    "kind",
    [S.FINISH_KIND_STOP, S.FINISH_KIND_MAX_TOKENS, S.FINISH_KIND_ERROR, S.FINISH_KIND_ABORTED],
)
async def test_finish_kinds(kind: S.FinishKind.ValueType):
    step = scripted_pb2.ScriptedStep(finish=kind, error_message="why", error_code="CODE")
    chunks = await collect(ScriptedModel(), request(script=[step]))
    assert chunks[-1].finish == S.Finish(kind=kind, message="why", code="CODE")


async def test_per_agent_cursor_and_default_tool_ids():
    script = [
        scripted_pb2.ScriptedStep(text="one"),
        scripted_pb2.ScriptedStep(tool_calls=[scripted_pb2.ScriptedToolCall(name="t")]),
        scripted_pb2.ScriptedStep(text="three"),
    ]
    model = ScriptedModel()
    first = assembled(await collect(model, request(script=script))).content
    other = assembled(await collect(model, request(script=script, agent_id="a2"))).content
    second = assembled(await collect(model, request(script=script))).content
    third = assembled(await collect(model, request(script=script))).content
    assert first[0].text.text == "one"
    assert other[0].text.text == "one"
    assert second[0].tool_call.id == "call_2_1"
    assert third[0].text.text == "three"
    assert model.calls("a1") == 3
    assert model.calls("a2") == 1
    model.release("a1")
    assert model.calls("a1") == 0


async def test_script_exhausted_falls_back_to_echo():
    model = ScriptedModel()
    req = request([user("hi")], [scripted_pb2.ScriptedStep(text="scripted")])
    assert assembled(await collect(model, req)).content[0].text.text == "scripted"
    assert assembled(await collect(model, req)).content[0].text.text == "You said: hi"


async def test_default_echo_in_chunks_of_eight_with_usage():
    messages = [user("first question"), assistant("an answer"), user("what is up?")]
    chunks = await collect(ScriptedModel(), request(messages))
    reply = "You said: what is up?"
    deltas = [c.block_delta.text for c in chunks if c.HasField("block_delta")]
    assert deltas == [reply[i : i + 8] for i in range(0, len(reply), 8)]
    assert max(len(d) for d in deltas) == 8
    chars = len("first question") + len("an answer") + len("what is up?")
    assert chunks[-2].usage == C.Usage(input_tokens=chars // 4, output_tokens=len(reply) // 4)
    assert chunks[-1].finish.kind == S.FINISH_KIND_STOP


async def test_a_long_history_is_counted_a_slice_at_a_time_with_the_same_usage():
    messages = [
        user(f"question {i}") if i % 2 == 0 else assistant("ok") for i in range(2 * COUNT_SLICE + 1)
    ]
    chars = sum(len(f"question {i}") if i % 2 == 0 else 2 for i in range(len(messages)))
    ran = 0
    counting = True

    async def probe() -> None:  # runs whenever the count yields
        nonlocal ran
        while counting:
            ran += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0)
    before = ran
    model = ScriptedModel()
    chunks = await collect(model, request(messages))
    counting = False
    await task
    reply = f"You said: question {2 * COUNT_SLICE}"
    assert chunks[-2].usage == C.Usage(input_tokens=chars // 4, output_tokens=len(reply) // 4)
    assert ran - before >= 2  # the two yields between its three slices (the stream may add)
    longer = [*messages, assistant("an answer"), user("and now?")]  # carried over: one slice
    chunks = await collect(model, request(longer))
    total = chars + len("an answer") + len("and now?")
    assert chunks[-2].usage.input_tokens == total // 4


async def test_default_echo_uses_the_latest_user_text():
    chunks = await collect(ScriptedModel(), request([user("hello"), assistant("hey")]))
    assert assembled(chunks).content[0].text.text == "You said: hello"


async def test_default_greets_without_user_text():
    chunks = await collect(ScriptedModel(), request())
    assert assembled(chunks).content[0].text.text == GREETING


async def test_default_word_count_round_trip():
    model = ScriptedModel()
    # Step 1: the tool is offered and the user wrote text, so the model calls it.
    first = await collect(model, request([user("count these words")], tools=["word_count"]))
    call = assembled(first).content[0].tool_call
    assert call.id == "call_1_1"
    assert call.name == "word_count"
    assert json.loads(call.arguments) == {"text": "count these words"}
    assert first[-2].HasField("usage")
    # Step 2: the history ends with the tool result, so the model summarises it.
    history = [
        user("count these words"),
        C.Message(role=C.ROLE_ASSISTANT, content=[C.ContentBlock(tool_call=call)]),
        tool_results((call.id, "3")),
    ]
    second = await collect(model, request(history, tools=["word_count"]))
    message = assembled(second)
    assert message.content[0].text.text == "Tool results: 3"
    assert message.finish == S.Finish(kind=S.FINISH_KIND_STOP)


async def test_default_summarises_several_results():
    chunks = await collect(ScriptedModel(), request([tool_results(("c1", "a"), ("c2", "b"))]))
    assert assembled(chunks).content[0].text.text == "Tool results: a; b"


async def test_default_without_word_count_offered_echoes():
    chunks = await collect(ScriptedModel(), request([user("count")], tools=["other"]))
    assert assembled(chunks).content[0].text.text == "You said: count"


async def test_abort_before_streaming_raises():
    controller = AbortController()
    controller.abort("stop")
    with pytest.raises(Aborted) as info:
        await collect(ScriptedModel(), request([user("hi")]), controller.signal)
    assert info.value.reason == "stop"


async def test_cancellation_mid_stream_with_chunk_delay():
    delay = duration_pb2.Duration()
    delay.FromMilliseconds(20)
    step = scripted_pb2.ScriptedStep(text="x" * 1000, chunk_delay=delay)
    controller = AbortController()
    first_chunk = asyncio.Event()
    received: list[S.StreamChunk] = []

    async def consume() -> None:
        async for chunk in ScriptedModel().stream(request(script=[step]), controller.signal):
            received.append(chunk)
            first_chunk.set()

    async def interrupt() -> None:
        await first_chunk.wait()
        controller.abort("user interrupt")

    consumer = asyncio.create_task(consume())
    interrupter = asyncio.create_task(interrupt())
    with pytest.raises(Aborted) as info:
        await asyncio.wait_for(consumer, timeout=10)  # a hang guard: the stream is 20 s
    await interrupter
    assert info.value.reason == "user interrupt"
    # Far fewer chunks than the ~1000 scripted: the abort cut the stream short.
    assert 1 <= len(received) < 5


async def test_abort_during_a_long_delay_is_prompt():
    step = scripted_pb2.ScriptedStep(text="ab", chunk_delay=duration_pb2.Duration(seconds=30))
    controller = AbortController()
    stream = ScriptedModel().stream(request(script=[step]), controller.signal)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.01)
    assert not pending.done()
    controller.abort("now")
    with pytest.raises(Aborted):
        await asyncio.wait_for(pending, timeout=1)
