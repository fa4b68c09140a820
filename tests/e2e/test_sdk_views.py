"""The SDK's turn view, its new verbs and its typed errors, against a real server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from agentloop import (
    AlreadyExists,
    Client,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    connect,
    connect_sync,
)
from agentloop.v1 import content_pb2, scripted_pb2
from tests.e2e.conftest import E2E, READ_TIMEOUT

SLEEPS = scripted_pb2.ScriptedStep(
    text="Sleeping twice.",
    tool_calls=[
        scripted_pb2.ScriptedToolCall(id="long", name="sleep", arguments='{"seconds": 0.4}'),
        scripted_pb2.ScriptedToolCall(id="short", name="sleep", arguments='{"seconds": 0.05}'),
    ],
    usage=content_pb2.Usage(input_tokens=10, output_tokens=4),
)
DONE = scripted_pb2.ScriptedStep(
    text="done sleeping", chunk_size=3, usage=content_pb2.Usage(input_tokens=20, output_tokens=2)
)
SCRIPT = scripted_pb2.ScriptedOptions(steps=[SLEEPS, DONE])


@contextlib.asynccontextmanager
async def sdk(e2e: E2E) -> AsyncIterator[Client]:
    client = connect(e2e.target, timeout=READ_TIMEOUT)
    try:
        yield client
    finally:
        await client.close()


async def test_the_view_of_a_turn_with_parallel_tool_calls(e2e: E2E) -> None:
    async with sdk(e2e) as client:
        await client.create(
            "v1", provider="scripted", model="m", tools=["sleep"], provider_options=SCRIPT
        )
        turn = await client.send("v1", "sleep twice")
        async with asyncio.timeout(READ_TIMEOUT):
            deltas = [text async for text in turn.text_deltas()]
            view = await turn.view()
    # The text is the assistant's, never the tool calls' argument JSON.
    assert "".join(deltas) == "Sleeping twice.done sleeping"
    assert view.text == "Sleeping twice.\ndone sleeping"
    assert view.final_text == "done sleeping"
    # The calls in the model's order, each with its own result though the short one
    # finished first.
    assert [(c.call_id, c.name) for c in view.tool_calls] == [("long", "sleep"), ("short", "sleep")]
    assert [c.parsed_arguments() for c in view.tool_calls] == [{"seconds": 0.4}, {"seconds": 0.05}]
    assert all(c.result is not None and c.result.call_id == c.call_id for c in view.tool_calls)
    assert [c.result_text for c in view.tool_calls] == ["slept 0.4 seconds", "slept 0.05 seconds"]
    assert not any(c.is_error for c in view.tool_calls)
    assert (view.usage.input_tokens, view.usage.output_tokens) == (30, 6)
    assert (view.turn, view.steps, view.end_reason, view.end_detail) == (1, 2, "completed", "")
    assert view.end is not None and view.end == turn.end


async def test_the_view_of_a_cancelled_turn_says_why(e2e: E2E) -> None:
    nap = scripted_pb2.ScriptedToolCall(name="sleep", arguments='{"seconds": 60}')
    script = scripted_pb2.ScriptedOptions(steps=[scripted_pb2.ScriptedStep(tool_calls=[nap])])
    async with sdk(e2e) as client:
        await client.create("v2", provider="scripted", tools=["sleep"], provider_options=script)
        turn = await client.send("v2", "nap")
        async with asyncio.timeout(READ_TIMEOUT):
            async for event in turn:
                if event.HasField("tool_call"):
                    await client.cancel("v2", "enough")
            view = await turn.view()  # read already: the view needs no second read
    assert (view.end_reason, view.end_detail) == ("aborted", "enough")
    (call,) = view.tool_calls
    assert call.name == "sleep" and call.is_error


async def test_session_verbs_read_what_the_turn_wrote(e2e: E2E) -> None:
    async with sdk(e2e) as client:
        created = await client.create("v3", provider="scripted", model="echo", cwd="/tmp")
        agent = await client.get_agent("v3")
        assert (agent.agent_id, agent.session_id) == ("v3", created.session_id)
        ended = await (await client.send("v3", "hello")).result()
        session = await client.get_session(agent_id="v3")
        assert session.session_id == created.session_id
        assert (await client.get_session(session_id=created.session_id)) == session
        events = await client.list_events(session_id=created.session_id)
        assert [e.seq for e in events] == list(range(1, ended.seq + 1))
        tail = await client.list_events(agent_id="v3", from_seq=ended.seq)
        assert [e.WhichOneof("payload") for e in tail] == ["turn_end"]
        with pytest.raises(ValueError, match="exactly one"):
            await client.get_session(agent_id="v3", session_id=created.session_id)


async def test_refusals_are_typed_errors_with_their_details(e2e: E2E) -> None:
    async with sdk(e2e) as client:
        with pytest.raises(NotFound) as missing:
            await client.send("nobody", "hi")
        assert missing.value.reason == "AGENT_NOT_FOUND"
        assert missing.value.domain == "agentloop.v1"
        assert "nobody" in missing.value.message
        await client.create("v4", provider="scripted")
        with pytest.raises(AlreadyExists):
            await client.create("v4", provider="scripted")
        with pytest.raises(InvalidArgument) as bad:
            await client.create("v5", provider="scripted", max_parallel_tool_calls=0)
        assert bad.value.reason == "INVALID_FIELD"
        assert bad.value.field == "options.max_parallel_tool_calls"
        assert bad.value.field_violations[0].description
        await client.dispose("v4")
        with pytest.raises(FailedPrecondition) as disposed:
            await client.send("v4", "hi")
        assert disposed.value.reason == "AGENT_DISPOSED"
        # Still a grpc.aio.AioRpcError, for code written against the raw stubs.
        assert disposed.value.code().name == "FAILED_PRECONDITION"
        with pytest.raises(NotFound) as streamed:
            async for _ in client.stream(session_id="no-such-session"):
                pass
        assert streamed.value.reason == "SESSION_NOT_FOUND"


def sync_program(address: str) -> tuple[str, list[str], str]:
    with connect_sync(address, timeout=READ_TIMEOUT) as client:
        agent = client.create("v6", provider="scripted", tools=["sleep"], provider_options=SCRIPT)
        with client.conversation("v6") as chat:
            view = chat.send("sleep twice").view()
        stored = client.stream(session_id=agent.session_id, replay_only=True)
        kinds = [str(e.WhichOneof("payload")) for e in stored]
        try:
            client.get_agent("nobody")
        except NotFound as error:
            reason = error.reason
    return view.final_text, kinds, reason


async def test_the_sync_client_views_streams_and_raises_the_same(e2e: E2E) -> None:
    final, kinds, reason = await asyncio.wait_for(
        asyncio.to_thread(sync_program, e2e.target), READ_TIMEOUT
    )
    assert final == "done sleeping"
    assert kinds[0] == "turn_start" and kinds[-1] == "turn_end"
    assert reason == "AGENT_NOT_FOUND"
