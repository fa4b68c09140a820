"""The OpenAI adapter keeps each agent's history encoded between requests: the bytes it
sends must stay those of the straightforward encoding (`json.dumps(request_body(...))`),
over a conversation against a real HTTP server standing in for the provider, and for
every kind of history in process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf import struct_pb2

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from server.kernel import seams as S
from server.kernel.content import plain_text, text_content
from server.kernel.tools import Tool, ToolExecution
from server.lifecycle.factory import AgentFactory
from server.loop.runtime import Runtime
from server.models import ModelRequest
from server.models.openai import OpenAIModel
from server.models.openai_body import ChatHistory, request_bytes
from server.models.openai_wire import NOT_RUN, request_body
from server.sessions.session import SessionLog
from server.stores.sqlite import SqliteStore
from tests.fake_openai import FakeOpenAI, Reply, call, chunk, text, usage
from tests.replayed_requests import replayed_requests

OPTIONS = agent_pb2.AgentOptions(provider="fake", model="gpt-test", tools=["words"])


async def count_words(exec: ToolExecution) -> str:
    arguments = exec.arguments if isinstance(exec.arguments, dict) else {}
    return str(len(str(arguments.get("text", "")).split()))


WORDS = Tool(
    name="words",
    description="Counts words.",
    # One key per object: a Struct's map keeps no order, so a header parsed anew (the
    # replayed one) may list several keys otherwise than the live one did.
    input_schema={"properties": {"text": {"type": "string"}}},
    execute=count_words,
)


def straightforward(request: ModelRequest, model: str = "gpt-test") -> bytes:
    """The body as the adapter encoded it before it kept anything between requests."""
    return json.dumps(request_body(request, model)).encode()


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


async def test_a_conversation_sends_the_bytes_of_the_straightforward_encoding(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(
        # turn 1: one tool call, then a text the step-result listener rewrites
        Reply(
            events=[
                call(0, "", "call_1", "words"),
                call(0, '{"text": "a b c"}'),
                chunk(finish="tool_calls"),
                usage(10, 2),
            ]
        ),
        Reply(events=text("three words ✓")),
        # turn 2: two calls at once (arguments of the second left empty), then a text
        Reply(
            events=[
                call(0, '{"text": "x"}', "call_2", "words"),
                call(1, "", "call_3", "words"),
                chunk(finish="tool_calls"),
            ]
        ),
        Reply(events=text('one, then "none"\n')),
        # turn 3: a text only; turn 4 (after a resume): a text only
        Reply(events=text("plain")),
        Reply(events=text("resumed")),
    )
    runtime = Runtime(store=SqliteStore(tmp_path / "agentloop.db"))  # so that it resumes
    model = OpenAIModel(name="fake", base_url=fake.base_url, default_model="gpt-default")
    runtime.models.register("fake", model)
    runtime.tools.register(WORDS)
    compositions: list[int] = []

    async def prefix(
        call: S.SessionPrefix, next_: S.Next[S.SessionPrefix, list[c.Message]]
    ) -> list[c.Message]:
        compositions.append(1)  # once per loop instance: another prefix after the resume
        mine = c.Message(role=c.ROLE_USER, content=text_content(f"PREFIX {len(compositions)}"))
        return [mine, *(await next_())]

    async def rewrite(call: S.StepResult, next_: S.Next[S.StepResult, c.Message]) -> c.Message:
        message = await next_()
        said = plain_text(message.content)
        if not said:
            return message
        # A new message object, whose content is not the streamed one.
        return c.Message(role=c.ROLE_ASSISTANT, content=text_content(f"REWRITTEN: {said}"))

    runtime.seams.on(S.SESSION_PREFIX, prefix)
    runtime.seams.on(S.STEP_RESULT, rewrite)
    factory = AgentFactory(runtime)
    try:
        agent = await factory.create("a1", OPTIONS)
        for prompt in ("count a b c", 'é "quoted"\n\t<b>&', "and now?"):
            agent.send(text_content(prompt))
            await asyncio.wait_for(agent.when_idle(), 10)
        session_id = agent.session.session_id
        assert "a1" in model._histories
        await factory.dispose("a1")
        assert "a1" not in model._histories  # what it kept goes with the agent
        agent = await factory.resume("a1", session_id, None)
        agent.send(text_content("still there?"))
        await asyncio.wait_for(agent.when_idle(), 10)
        events = await agent.session.read(1, 10_000)
    finally:
        await factory.close()
        await model.aclose()
        await runtime.store.close()
    requests = replayed_requests(events)
    assert len(requests) == len(fake.requests) == 6
    for request, seen in zip(requests, fake.requests, strict=True):
        assert seen.raw == straightforward(request), (request.turn, request.step)
    # The rewrite reached the next requests; each loop instance's prefix fronted its own.
    rewritten = {"role": "assistant", "content": "REWRITTEN: three words ✓"}
    assert rewritten in fake.requests[2].body["messages"]
    assert [seen.body["messages"][1]["content"] for seen in fake.requests] == ["PREFIX 1"] * 5 + [
        "PREFIX 2"
    ]
    second_turn = fake.requests[3].body["messages"]
    assert second_turn[-3]["tool_calls"][1]["function"]["arguments"] == "{}"
    assert [m["tool_call_id"] for m in second_turn[-2:]] == ["call_2", "call_3"]


# -- every kind of history, in process -----------------------------------------------------


def block(**kind: object) -> c.ContentBlock:
    return c.ContentBlock(**kind)  # type: ignore[arg-type]


def tool_call(call_id: str, arguments: str = "{}") -> c.ContentBlock:
    return block(tool_call=c.ToolCallBlock(id=call_id, name="word_count", arguments=arguments))


def tool_result(call_id: str, said: str) -> ev.ToolResult:
    return ev.ToolResult(call_id=call_id, content=text_content(said))


def assistant(*content: c.ContentBlock) -> ev.AssistantMessage:
    return ev.AssistantMessage(content=content, provenance=c.Provenance(provider="p", model="m"))


HISTORY: list[object] = [
    ev.UserMessage(content=text_content("plain")),
    assistant(*text_content("sure")),
    ev.UserMessage(content=[*text_content("look: "), *text_content("two blocks")]),
    assistant(block(reasoning=c.ReasoningBlock(text="hmm")), *text_content("I see")),
    assistant(),  # an empty answer: a completion anchor, no history message
    ev.UserMessage(content=text_content('ünïcode ✓ "quotes" \\ back\nslash \x00 \u2028 🎉')),
    assistant(*text_content("two calls"), tool_call("k1", '{"text": "a"}'), tool_call("k2", "")),
    tool_result("k1", "1"),
    tool_result("k2", "0"),
    assistant(tool_call("k3"), tool_call("k4")),
    tool_result("k3", "answered"),  # k4 never ran: a cancel stopped its batch
    ev.ContextMessage(content=text_content("a context"), source=c.Source(kind="hook", name="h")),
    ev.SteeringMessage(content=text_content("steer"), source=c.Source(kind="user")),
    assistant(tool_call("k5")),  # left unanswered at the end of the history
]


def appended(log: SessionLog, payload: object) -> None:
    log.add(payload)  # type: ignore[arg-type]


def header(prefix: list[c.Message], system: str = "You are a test.") -> c.RequestHeader:
    schema = struct_pb2.Struct()
    schema.update({"type": "object", "properties": {"text": {"type": "string"}}})
    return c.RequestHeader(
        config=c.ModelConfig(
            provider="p", model="m", temperature=0.5, max_tokens=99, stop=["STOP"]
        ),
        system=system,
        tools=[c.ToolSchema(name="word_count", description="counts", input_schema=schema)],
        message_prefix=prefix,
    )


def request_of(log: SessionLog, head: c.RequestHeader) -> ModelRequest:
    messages = log.history().behind(head.message_prefix)
    return ModelRequest("a", "s", 1, 1, head, messages, agent_pb2.AgentOptions())


def test_each_request_of_a_growing_history_is_the_straightforward_body() -> None:
    kept = ChatHistory()
    log = SessionLog("s", session_pb2.SessionHeader())
    prefix_call = c.Message(role=c.ROLE_ASSISTANT, content=[tool_call("p1")])
    prefixes = [
        [],
        [c.Message(role=c.ROLE_USER, content=text_content("P"))],
        [prefix_call],  # a call the prefix leaves unanswered shapes the history's messages
    ]
    for i, payload in enumerate(HISTORY):
        appended(log, payload)
        for prefix in prefixes:  # the prefix and the system prompt change between requests
            for system in ("", f"system {i}"):
                request = request_of(log, header(prefix, system))
                assert request_bytes(request, "m", "auto", kept) == straightforward(request, "m")
    body = json.loads(straightforward(request_of(log, header([prefix_call])), "m"))
    stand_ins = [m["tool_call_id"] for m in body["messages"] if m.get("content") == NOT_RUN]
    assert stand_ins == ["p1", "k4", "k5"]  # the prefix's, one mid-history, one at the end
    assert {"role": "user", "content": "look: two blocks"} in body["messages"]


def test_a_replaced_history_an_older_view_and_a_plain_list_are_encoded_afresh() -> None:
    kept = ChatHistory()
    log = SessionLog("s", session_pb2.SessionHeader())
    for payload in HISTORY:
        appended(log, payload)
    head = header([])
    older = request_of(log, head)
    appended(log, ev.UserMessage(content=text_content("one more")))
    newer = request_of(log, head)
    summary = ev.UserMessage(content=text_content("summary"))
    compacted = ev.SessionEvent(seq=log.count, user_message=summary)
    compacted.surface_op.CopyFrom(ev.SurfaceOp(kind=ev.SURFACE_OP_KIND_REPLACE, start=0, end=5))
    log.projection.apply(compacted)  # a stored compaction, as a resume replays it
    replaced = request_of(log, head)
    as_list = ModelRequest("a", "s", 1, 1, head, list(newer.messages), agent_pb2.AgentOptions())
    for request in (newer, older, replaced, as_list, newer, replaced):
        assert request_bytes(request, "m", "auto", kept) == straightforward(request, "m")
    assert json.loads(straightforward(replaced, "m"))["messages"][1]["content"] == "summary"
