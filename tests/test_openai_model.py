"""Tests of the OpenAI-compatible provider against a fake server on a real socket."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from google.protobuf import struct_pb2

from agentloop.v1 import agent_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import stream_pb2 as st
from server.kernel.abort import NEVER, AbortController, AbortSignal
from server.kernel.assembly import MessageAssembler
from server.kernel.content import plain_text, text_content
from server.kernel.errors import Aborted, CodedError
from server.lifecycle.factory import AgentFactory
from server.loop.builtin_tools import builtin_tools
from server.loop.runtime import Runtime
from server.models import ModelRequest
from server.models.openai import OpenAIModel
from tests.fake_openai import Event, FakeOpenAI, Raw, Reply, call, chunk, text, usage
from tests.invariants import check_log

KEY = "sk-test-0123456789-secret"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


OPEN_MODELS: list[OpenAIModel] = []


@pytest.fixture(autouse=True)
async def close_models() -> AsyncIterator[None]:
    """Each model's connection pool is closed when its test ends."""
    yield
    while OPEN_MODELS:
        await OPEN_MODELS.pop().aclose()


def make_model(fake: FakeOpenAI, **kwargs: Any) -> OpenAIModel:
    kwargs.setdefault("initial_backoff", 0.01)
    kwargs.setdefault("max_backoff", 0.05)
    return opened(
        OpenAIModel(
            name="openai",
            base_url=fake.base_url,
            api_key=KEY,
            headers={"X-Extra": "yes"},
            default_model="gpt-default",
            **kwargs,
        )
    )


def opened(model: OpenAIModel) -> OpenAIModel:
    OPEN_MODELS.append(model)
    return model


def request(
    messages: Sequence[c.Message] = (),
    tools: Sequence[c.ToolSchema] = (),
    system: str = "",
    **config: Any,
) -> ModelRequest:
    return ModelRequest(
        agent_id="a1",
        session_id="a1-session",
        turn=1,
        step=1,
        header=c.RequestHeader(
            config=c.ModelConfig(provider="openai", model="gpt-test", **config),
            system=system,
            tools=list(tools),
        ),
        messages=list(messages) or [c.Message(role=c.ROLE_USER, content=text_content("hi"))],
        options=agent_pb2.AgentOptions(provider="openai"),
    )


async def collect(
    model: OpenAIModel, req: ModelRequest | None = None, signal: AbortSignal = NEVER
) -> list[st.StreamChunk]:
    return [ch async for ch in model.stream(req or request(), signal)]


def assemble(chunks: list[st.StreamChunk]) -> MessageAssembler:
    assembler = MessageAssembler()
    for ch in chunks:
        assembler.add(ch)
    return assembler


def kinds(chunks: list[st.StreamChunk]) -> list[str | None]:
    return [ch.WhichOneof("chunk") for ch in chunks]


async def failure(model: OpenAIModel, req: ModelRequest | None = None) -> CodedError:
    with pytest.raises(CodedError) as caught:
        await collect(model, req)
    return caught.value


# -- replies ------------------------------------------------------------------------------


async def test_text_reply(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[*text("Hel", "lo ", "world")]))
    chunks = await collect(make_model(fake))
    assert kinds(chunks) == [
        "block_start", "block_delta", "block_delta", "block_delta", "block_end", "finish"
    ]  # fmt: skip
    assert chunks[0].block_start.kind == st.BLOCK_KIND_TEXT
    result = assemble(chunks)
    assert plain_text(result.content) == "Hello world"
    assert result.finish is not None and result.finish.kind == st.FINISH_KIND_STOP
    assert result.usage is None


async def test_tool_call_arguments_in_fragments(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(
            events=[
                call(0, "", call_id="call_1", name="word_count"),
                call(0, '{"te'),
                call(0, 'xt": "a b'),
                call(0, ' c"}'),
                chunk(finish="tool_calls"),
            ]
        )
    )
    chunks = await collect(make_model(fake))
    start = chunks[0].block_start
    assert (start.kind, start.tool_call_id, start.tool_name) == (
        st.BLOCK_KIND_TOOL_CALL, "call_1", "word_count"
    )  # fmt: skip
    assert [ch.block_delta.text for ch in chunks if ch.HasField("block_delta")] == [
        '{"te', 'xt": "a b', ' c"}'
    ]  # fmt: skip
    result = assemble(chunks)
    [block] = result.content
    assert block.tool_call == c.ToolCallBlock(
        id="call_1", name="word_count", arguments='{"text": "a b c"}'
    )
    assert result.finish is not None and result.finish.kind == st.FINISH_KIND_STOP


async def test_two_parallel_tool_calls(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(
            events=[
                chunk({"content": "Let me check."}),
                call(0, '{"text":', call_id="call_a", name="word_count"),
                call(1, '{"seconds":', call_id="call_b", name="sleep"),
                call(0, ' "x"}'),
                call(1, " 1}"),
                chunk(finish="tool_calls"),
            ]
        )
    )
    result = assemble(await collect(make_model(fake)))
    assert [b.WhichOneof("block") for b in result.content] == ["text", "tool_call", "tool_call"]
    calls = [b.tool_call for b in result.content[1:]]
    assert [(t.id, t.name, t.arguments) for t in calls] == [
        ("call_a", "word_count", '{"text": "x"}'),
        ("call_b", "sleep", '{"seconds": 1}'),
    ]


async def test_usage_after_the_finish_reason(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[*text("ok"), usage(120, 7, cached=100)]))
    chunks = await collect(make_model(fake))
    assert kinds(chunks)[-3:] == ["block_end", "usage", "finish"]
    assert chunks[-2].usage == c.Usage(input_tokens=120, output_tokens=7, cached_input_tokens=100)


async def test_length_is_max_tokens(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=text("trunc", finish="length")))
    finish = assemble(await collect(make_model(fake))).finish
    assert finish is not None and finish.kind == st.FINISH_KIND_MAX_TOKENS


async def test_content_filter_is_an_error_finish(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=text("no", finish="content_filter")))
    finish = assemble(await collect(make_model(fake))).finish
    assert finish is not None and finish.kind == st.FINISH_KIND_ERROR
    assert finish.code == "FINISH_CONTENT_FILTER"
    assert "content_filter" in finish.message


async def test_reasoning_content_is_a_reasoning_block(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(
            events=[
                chunk({"role": "assistant", "reasoning_content": "Think"}),
                chunk({"reasoning_content": "ing..."}),
                chunk({"content": "Answer"}),
                chunk(finish="stop"),
            ]
        )
    )
    chunks = await collect(make_model(fake))
    assert chunks[0].block_start.kind == st.BLOCK_KIND_REASONING
    content = assemble(chunks).content
    assert [b.WhichOneof("block") for b in content] == ["reasoning", "text"]
    assert content[0].reasoning.text == "Thinking..."
    assert content[1].text.text == "Answer"


async def test_event_stream_framing_is_tolerated(fake: FakeOpenAI) -> None:
    first = json.dumps(chunk({"content": "a"}))
    second = json.dumps(chunk({"content": "b"}))
    cut = second.index(", ") + 1  # a newline there is JSON whitespace
    fake.script(
        Reply(
            done=False,
            framing="close",  # no chunked encoding: the body ends with the connection
            events=[
                Raw(b": keep-alive comment\r\n\r\n"),
                Raw(f"data: {first}\r\n\r\n".encode()),
                Raw(f"data: {second[:cut]}".encode()),  # one event split across reads,
                Raw(f"\ndata: {second[cut:]}\n\n".encode(), delay=0.05),  # and two data lines
                Raw(b"event: ping\n\n"),
                Raw(f"data: {json.dumps(chunk(finish='stop'))}\r\n\r\ndata: [DONE]\r\n".encode()),
            ],
        )
    )
    result = assemble(await collect(make_model(fake)))
    assert plain_text(result.content) == "ab"
    assert result.finish is not None and result.finish.kind == st.FINISH_KIND_STOP


# -- failures and retries -----------------------------------------------------------------


async def test_500_is_retried(fake: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    fake.script(
        Reply(status=500, body={"error": {"message": f"server hiccup for {KEY}"}}),
        Reply(events=text("fine")),
    )
    with caplog.at_level(logging.DEBUG):
        result = assemble(await collect(make_model(fake)))
    assert plain_text(result.content) == "fine"
    assert len(fake.requests) == 2
    assert fake.requests[0].body == fake.requests[1].body
    assert "openai: HTTP 500 on attempt 1 of 3; retrying" in caplog.text
    assert KEY not in caplog.text


async def test_a_hang_up_before_the_response_is_retried(fake: FakeOpenAI) -> None:
    fake.script(Reply(drop=True), Reply(events=text("second try")))
    result = assemble(await collect(make_model(fake)))
    assert plain_text(result.content) == "second try"
    assert len(fake.requests) == 2


async def test_json_instead_of_a_stream(fake: FakeOpenAI) -> None:
    fake.script(Reply(status=200, body={"error": {"message": "streaming unsupported"}}))
    error = await failure(make_model(fake))
    assert error.code == "BAD_RESPONSE"
    assert str(error) == "openai: expected an event stream, got JSON: streaming unsupported"


def test_constructor_checks_its_settings() -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAIModel(base_url="ftp://example.com", api_key=KEY)
    with pytest.raises(ValueError, match="line break") as caught:
        OpenAIModel(base_url="http://localhost", api_key=KEY + "\n")
    assert KEY not in str(caught.value)
    with pytest.raises(ValueError, match="max_attempts"):
        OpenAIModel(base_url="http://localhost", max_attempts=0)
    model = OpenAIModel(base_url="http://localhost/v1/", headers={"authorization": "Other x"})
    assert model.base_url == "http://localhost/v1"
    assert "headers=['Accept', 'Content-Type', 'authorization']" in repr(model)


async def test_401_is_not_retried_and_hides_the_key(fake: FakeOpenAI) -> None:
    message = f"Incorrect API key provided: {KEY}. Find yours at example.com."
    fake.script(Reply(status=401, body={"error": {"message": message, "code": "invalid_api_key"}}))
    model = make_model(fake)
    error = await failure(model)
    assert error.code == "HTTP_401"
    assert str(error).startswith("openai: HTTP 401: Incorrect API key provided")
    assert KEY not in str(error) and KEY not in repr(error)
    assert KEY not in repr(model) and "api_key=<set>" in repr(model)
    assert len(fake.requests) == 1


async def test_429_honours_retry_after(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(status=429, headers={"Retry-After": "1"}, body={"error": {"message": "slow down"}}),
        Reply(events=text("ok")),
    )
    result = assemble(await collect(make_model(fake)))
    assert plain_text(result.content) == "ok"
    first, second = fake.requests
    assert second.time - first.time >= 0.9


async def test_retries_give_up_after_max_attempts(fake: FakeOpenAI) -> None:
    fake.script(*[Reply(status=503, body={"error": {"message": "overloaded"}})] * 3)
    error = await failure(make_model(fake, max_attempts=2))
    assert (error.code, str(error)) == ("HTTP_503", "openai: HTTP 503: overloaded")
    assert len(fake.requests) == 2


async def test_stream_cut_midway(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=text("a", "b", "c"), cut_after=2))
    model = make_model(fake)
    seen: list[st.StreamChunk] = []
    with pytest.raises(CodedError) as caught:
        async for ch in model.stream(request(), NEVER):
            seen.append(ch)  # noqa: PERF401 -- a comprehension would lose them on the raise
    assert caught.value.code == "STREAM_INTERRUPTED"
    assert str(caught.value).startswith("openai: ")
    assert kinds(seen) == ["block_start", "block_delta"]  # what came before the cut
    assert len(fake.requests) == 1  # never retried once chunks were yielded


async def test_invalid_json_chunk(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[chunk({"content": "a"}), '{"choices": [', chunk(finish="stop")]))
    error = await failure(make_model(fake))
    assert error.code == "BAD_CHUNK"
    assert "invalid JSON" in str(error)


async def test_error_event_in_stream(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[{"error": {"message": "model overloaded mid-stream"}}]))
    error = await failure(make_model(fake))
    assert error.code == "STREAM_ERROR"
    assert "model overloaded mid-stream" in str(error)


async def test_connection_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = opened(
        OpenAIModel(
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key=KEY,
            max_attempts=2,
            initial_backoff=0.01,
        )
    )
    error = await failure(model)
    assert error.code == "CONNECTION_FAILED"
    assert "connection refused" in str(error) and KEY not in str(error)


async def test_read_timeout(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[chunk({"content": "a"}), Event(chunk(finish="stop"), delay=2)]))
    error = await failure(make_model(fake, read_timeout=0.2))
    assert error.code == "TIMEOUT"


# -- cancellation -------------------------------------------------------------------------


async def test_abort_mid_stream_closes_the_connection(fake: FakeOpenAI) -> None:
    slow = [Event(chunk({"content": f"w{i} "}), delay=0.3) for i in range(30)]
    fake.script(Reply(events=[chunk({"content": "start"}), *slow, chunk(finish="stop")]))
    controller = AbortController()
    streaming = asyncio.Event()

    async def consume() -> None:
        async for ch in make_model(fake).stream(request(), controller.signal):
            if ch.HasField("block_delta"):
                streaming.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(streaming.wait(), 5)
    controller.abort("user cancelled")
    # The reply would take 9 s more: the waits below are hang guards, the proof that the
    # stream stopped early is the hang-up of a reply that never completed.
    with pytest.raises(Aborted, match="user cancelled"):
        await asyncio.wait_for(task, 5)
    await asyncio.wait_for(fake.requests[0].hung_up.wait(), 5)
    assert not fake.requests[0].completed


async def test_aclose_closes_the_connection(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[chunk({"content": "a"}), Event(chunk(finish="stop"), delay=5)]))
    stream = make_model(fake).stream(request(), NEVER)
    first = await anext(stream)
    assert first.HasField("block_start")
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(fake.requests[0].hung_up.wait(), 1)


async def test_abort_during_retry_backoff(fake: FakeOpenAI) -> None:
    fake.script(Reply(status=429, headers={"Retry-After": "30"}, body={"error": {}}))
    controller = AbortController()
    task = asyncio.create_task(collect(make_model(fake), signal=controller.signal))
    await asyncio.wait_for(fake.wait_for_requests(1), 5)
    await asyncio.sleep(0.05)  # let the 429 be read: the abort lands in the backoff
    controller.abort("stop")
    with pytest.raises(Aborted):
        await asyncio.wait_for(task, 1)
    assert len(fake.requests) == 1


# -- the request ------------------------------------------------------------------------


async def test_request_body_and_headers(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=text("ok")))
    schema = struct_pb2.Struct()
    schema.update({"type": "object", "properties": {"text": {"type": "string"}}})
    tool = c.ToolSchema(name="word_count", description="Counts words.", input_schema=schema)
    history = [
        c.Message(role=c.ROLE_USER, content=text_content("count this")),
        c.Message(
            role=c.ROLE_ASSISTANT,
            content=[
                c.ContentBlock(reasoning=c.ReasoningBlock(text="hidden thoughts")),
                c.ContentBlock(text=c.TextBlock(text="Sure.")),
                c.ContentBlock(
                    tool_call=c.ToolCallBlock(id="call_1", name="word_count", arguments="{}")
                ),
            ],
        ),
        c.Message(
            role=c.ROLE_USER,
            content=[
                c.ContentBlock(
                    tool_result=c.ToolResultBlock(
                        tool_call_id="call_1", content=text_content("2 words")
                    )
                ),
                c.ContentBlock(text=c.TextBlock(text="<steering>more</steering>")),
            ],
        ),
    ]
    req = request(history, [tool], system="Be brief.", temperature=0.5, max_tokens=64, stop=["END"])
    await collect(make_model(fake), req)
    [seen] = fake.requests
    assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.headers["x-extra"] == "yes"
    assert seen.headers["content-type"] == "application/json"
    body = seen.body
    assert body["model"] == "gpt-test"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["max_tokens"], body["stop"]) == (0.5, 64, ["END"])
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "word_count",
                "description": "Counts words.",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
            },
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "count this"},
        {
            "role": "assistant",
            "content": "Sure.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "word_count", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "2 words"},
        {"role": "user", "content": "<steering>more</steering>"},
    ]


async def test_unset_config_is_not_sent(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=text("ok")))
    req = request()
    req.header.config.model = ""  # the provider's default model fills in
    await collect(make_model(fake), req)
    body = fake.requests[0].body
    assert body["model"] == "gpt-default"
    assert not {"temperature", "max_tokens", "stop", "tools"} & set(body)
    assert [m["role"] for m in body["messages"]] == ["user"]  # no empty system message


# -- whole turns through the loop -----------------------------------------------------------

AGENT_OPTIONS = agent_pb2.AgentOptions(provider="fake", model="gpt-test", tools=["word_count"])


def make_factory(fake: FakeOpenAI) -> AgentFactory:
    runtime = Runtime()
    runtime.models.register("fake", make_model(fake))
    for tool in builtin_tools():
        runtime.tools.register(tool)
    return AgentFactory(runtime)


async def test_agent_cancel_mid_stream(fake: FakeOpenAI) -> None:
    slow = [Event(chunk({"content": "."}), delay=0.5) for _ in range(20)]
    fake.script(Reply(events=[chunk({"content": "Thinking"}), *slow, chunk(finish="stop")]))
    factory = make_factory(fake)
    try:
        agent = await factory.create("a1", AGENT_OPTIONS)
        streaming = asyncio.Event()

        def on_event(event: Any) -> None:
            if event.HasField("assistant_chunk"):
                streaming.set()

        agent.session.observers.append(on_event)
        agent.send([c.ContentBlock(text=c.TextBlock(text="go"))])
        await asyncio.wait_for(streaming.wait(), 5)
        agent.cancel("changed my mind")
        # The reply would take 10 s more: the waits are hang guards; the turn ended
        # aborted on a reply that never completed.
        await asyncio.wait_for(agent.when_idle(), 5)
        check_log(agent.session.events)
        [end] = [e.turn_end for e in agent.session.events if e.HasField("turn_end")]
        assert end.reason.aborted.reason == "changed my mind"
        await asyncio.wait_for(fake.requests[0].hung_up.wait(), 5)
        assert not fake.requests[0].completed
    finally:
        await factory.close()


async def test_agent_turn_with_a_tool_round_trip(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(
            events=[
                call(0, "", call_id="call_wc", name="word_count"),
                call(0, '{"text": "one two'),
                call(0, ' three four"}'),
                chunk(finish="tool_calls"),
                usage(50, 12),
            ]
        ),
        Reply(events=[*text("That is ", "4 words."), usage(80, 5, cached=40)]),
    )
    factory = make_factory(fake)
    try:
        agent = await factory.create("a1", AGENT_OPTIONS)
        agent.send([c.ContentBlock(text=c.TextBlock(text="one two three four"))])
        await asyncio.wait_for(agent.when_idle(), 10)
        events = agent.session.events
        check_log(events)
        [tool_call] = [e.tool_call for e in events if e.HasField("tool_call")]
        assert (tool_call.call_id, tool_call.name) == ("call_wc", "word_count")
        assert tool_call.arguments == '{"text": "one two three four"}'
        [result] = [e.tool_result for e in events if e.HasField("tool_result")]
        assert (result.call_id, plain_text(result.content)) == ("call_wc", "4 words")
        messages = [e.assistant_message for e in events if e.HasField("assistant_message")]
        assert plain_text(messages[-1].content) == "That is 4 words."
        assert messages[0].usage == c.Usage(input_tokens=50, output_tokens=12)
        assert messages[1].usage == c.Usage(
            input_tokens=80, output_tokens=5, cached_input_tokens=40
        )
        assert messages[1].provenance == c.Provenance(provider="fake", model="gpt-test")
        [end] = [e.turn_end for e in events if e.HasField("turn_end")]
        assert end.reason.WhichOneof("kind") == "completed"
    finally:
        await factory.close()
    first, second = fake.requests
    assert first.body["messages"][-1] == {"role": "user", "content": "one two three four"}
    assert [t["function"]["name"] for t in first.body["tools"]] == ["word_count"]
    assert second.body["messages"][-2]["tool_calls"][0]["id"] == "call_wc"
    assert second.body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_wc",
        "content": "4 words",
    }


async def test_agent_turn_cut_by_length_dispatches_no_tool(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(
            events=[
                chunk({"content": "Let me count"}),
                call(0, "", call_id="call_cut", name="word_count"),
                call(0, '{"text": "one tw'),
                chunk(finish="length"),
            ]
        )
    )
    factory = make_factory(fake)
    try:
        agent = await factory.create("a1", AGENT_OPTIONS)
        agent.send([c.ContentBlock(text=c.TextBlock(text="one two"))])
        await asyncio.wait_for(agent.when_idle(), 10)
        events = agent.session.events
        check_log(events)
        assert not [e for e in events if e.HasField("tool_call")]
        [message] = [e.assistant_message for e in events if e.HasField("assistant_message")]
        assert [b.WhichOneof("block") for b in message.content] == ["text"]
        [end] = [e.turn_end for e in events if e.HasField("turn_end")]
        assert end.reason.WhichOneof("kind") == "max_tokens"
        assert len(fake.requests) == 1
    finally:
        await factory.close()


def test_calls_left_unanswered_by_a_cancel_get_a_stand_in_answer() -> None:
    from server.models.openai_wire import NOT_RUN, chat_messages

    calls = [
        c.ContentBlock(tool_call=c.ToolCallBlock(id="c1", name="sleep", arguments="{}")),
        c.ContentBlock(tool_call=c.ToolCallBlock(id="c2", name="word_count", arguments="{}")),
    ]
    result = c.ContentBlock(
        tool_result=c.ToolResultBlock(tool_call_id="c1", content=text_content("Error: aborted"))
    )
    history = [
        c.Message(role=c.ROLE_USER, content=text_content("go")),
        c.Message(role=c.ROLE_ASSISTANT, content=calls),
        c.Message(role=c.ROLE_USER, content=[result]),
        c.Message(role=c.ROLE_USER, content=text_content("again")),
    ]
    out = chat_messages("", history)
    assert [(m["role"], m.get("tool_call_id")) for m in out] == [
        ("user", None), ("assistant", None), ("tool", "c1"), ("tool", "c2"), ("user", None)
    ]  # fmt: skip
    assert out[3]["content"] == NOT_RUN
