"""Accepted means durable, through a real server: shutdowns, retries, reconnects.

- SIGTERM with queued messages: they stay in the session's durable inbox and run
  after the restart (when the agent is resumed; for a config agent, at start);
- the same `request_id` sent twice, concurrently, and again after a restart yields one
  message and the first call's answer;
- a stream opened past the end of a log is OUT_OF_RANGE at once, also after a crash.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.models.scripted_options import script_options
from tests.e2e.conftest import EventStream
from tests.e2e.test_durability import (
    Server,
    T,
    create,
    list_events,
    resume,
    running_server,
    wait_idle,
)
from tests.fake_openai import Event, FakeOpenAI, Reply, text
from tests.invariants import check_log


def slow_then_quick(slow: bool = True) -> agent_pb2.AgentOptions:
    """The first model call streams for a minute (a shutdown interrupts it); then quick.

    The script restarts with each server process: resume with `slow=False`.
    """
    quick = [scripted_pb2.ScriptedStep(text=f"answer {i}") for i in range(4)]
    if slow:
        delay = duration_pb2.Duration(seconds=3)
        quick.insert(0, scripted_pb2.ScriptedStep(text="a very slow answer", chunk_delay=delay))
    return agent_pb2.AgentOptions(
        provider="scripted", model="m", provider_options=script_options(quick)
    )


def recorded(events: list[ev.SessionEvent], kind: str = "user_message") -> list[str]:
    """The request ids of the `kind` events, in log order."""
    return [getattr(e, kind).request_id for e in events if e.WhichOneof("payload") == kind]


async def send(
    server: Server, agent_id: str, text_: str, request_id: str
) -> api.SendMessageResponse:
    return await server.agents.SendMessage(
        api.SendMessageRequest(agent_id=agent_id, text=text_, request_id=request_id), timeout=T
    )


async def get_session(server: Server, session_id: str) -> api.GetSessionResponse:
    return await server.agents.GetSession(api.GetSessionRequest(session_id=session_id), timeout=T)


async def test_sigterm_keeps_queued_messages_and_they_run_after_resume(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        session_id = await create(server, "slow", slow_then_quick())
        await send(server, "slow", "first", "r1")
        with EventStream(server.agents, agent_id="slow") as stream:
            await stream.until("assistant_chunk")  # turn 1 is streaming, slowly
        await send(server, "slow", "second", "r2")
        await send(server, "slow", "third", "r3")
        await server.terminate()

    async with running_server(tmp_path) as server:
        described = await get_session(server, session_id)
        assert described.session.pending_messages == 2
        before = await list_events(server, session_id)
        assert recorded(before) == ["r1"]
        assert before[-1].turn_end.reason.WhichOneof("kind") == "disposed"

        await resume(server, "slow", session_id, slow_then_quick(slow=False))
        await wait_idle(server, "slow")
        after = await list_events(server, session_id)
        check_log(after)
        # Both queued messages ran, in order, in the turn after the disposed one, once.
        assert recorded(after) == ["r1", "r2", "r3"]
        assert after[-1].turn_end.reason.WhichOneof("kind") == "completed"
        assert (await get_session(server, session_id)).session.pending_messages == 0
        await server.terminate()


async def test_a_config_agent_brings_its_queued_messages_to_its_new_session(
    tmp_path: Path,
) -> None:
    async with FakeOpenAI() as fake:
        config = (
            f"providers:\n  - name: fake\n    baseUrl: {fake.base_url}\n"
            "agents:\n  - id: assistant\n    provider: fake\n    model: m\n"
        )
        fake.script(Reply(events=[Event(text("never finished")[0], delay=60)]))
        async with running_server(tmp_path, config) as server:
            first = await send(server, "assistant", "first", "c1")
            await fake.wait_for_requests(1)  # turn 1 waits on the model
            await send(server, "assistant", "second", "c2")
            await send(server, "assistant", "third", "c3")
            old = (await server.agents.GetSession(
                api.GetSessionRequest(agent_id="assistant"), timeout=T
            )).session.session_id  # fmt: skip
            await server.terminate()

        fake.script(Reply(events=text("done")))
        async with running_server(tmp_path, config) as server:
            new = (await server.agents.GetSession(
                api.GetSessionRequest(agent_id="assistant"), timeout=T
            )).session.session_id  # fmt: skip
            assert new != old  # a config agent starts on a fresh session every time
            await wait_idle(server, "assistant")
            moved = await list_events(server, new)
            assert recorded(moved) == ["c2", "c3"]  # adopted, in order, answered together
            assert moved[-1].turn_end.reason.WhichOneof("kind") == "completed"
            stale = await list_events(server, old)
            assert recorded(stale) == ["c1"]
            assert (await get_session(server, old)).session.pending_messages == 0

            # A client retrying across the restart gets the first answer; nothing runs.
            again = await send(server, "assistant", "first", "c1")
            assert again == first
            again = await send(server, "assistant", "second", "c2")
            await wait_idle(server, "assistant")
            assert recorded(await list_events(server, new)) == ["c2", "c3"]
            await server.terminate()


async def test_a_request_id_sent_twice_and_after_a_restart_is_one_message(
    tmp_path: Path,
) -> None:
    async with running_server(tmp_path) as server:
        session_id = await create(server, "a1")
        answers = await asyncio.gather(*(send(server, "a1", "hello", "same") for _ in range(5)))
        assert all(a == answers[0] for a in answers)
        await wait_idle(server, "a1")
        assert await send(server, "a1", "hello", "same") == answers[0]
        steer = await server.agents.SteerMessage(
            api.SteerMessageRequest(agent_id="a1", text="x", request_id="s1"), timeout=T
        )
        assert steer == await server.agents.SteerMessage(
            api.SteerMessageRequest(agent_id="a1", text="x", request_id="s1"), timeout=T
        )
        inject = await server.agents.InjectContext(
            api.InjectContextRequest(agent_id="a1", text="note", request_id="i1"), timeout=T
        )
        assert inject == await server.agents.InjectContext(
            api.InjectContextRequest(agent_id="a1", text="note", request_id="i1"), timeout=T
        )
        with pytest.raises(grpc.aio.AioRpcError) as reused:
            await server.agents.SteerMessage(
                api.SteerMessageRequest(agent_id="a1", text="x", request_id="same"), timeout=T
            )
        assert reused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request_id" in (reused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as too_long:
            await send(server, "a1", "x", "r" * 129)
        assert too_long.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await wait_idle(server, "a1")
        await server.crash()

    async with running_server(tmp_path) as server:
        await resume(server, "a1", session_id)
        assert await send(server, "a1", "hello", "same") == answers[0]
        await wait_idle(server, "a1")
        events = await list_events(server, session_id)
        assert recorded(events) == ["same", "s1"]  # idle steering is a message
        assert recorded(events, "context_message") == ["i1"]
        await server.terminate()


async def test_a_stream_past_the_end_is_out_of_range_also_after_a_crash(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        session_id = await create(server, "a1")
        await send(server, "a1", "count these words", "")
        await wait_idle(server, "a1")
        count = len(await list_events(server, session_id))  # seqs 1..count
        await expect_out_of_range(server, "a1", "", count + 2)
        await server.crash()

    async with running_server(tmp_path) as server:
        # The client had seen up to `count`; asking for more than exists is refused.
        await expect_out_of_range(server, "", session_id, count + 5)
        await resume(server, "a1", session_id)
        await expect_out_of_range(server, "a1", "", count + 2)
        # At the end exactly, a stream waits for the next event, which comes.
        with EventStream(server.agents, agent_id="a1", from_seq=count + 1) as stream:
            await send(server, "a1", "more", "")
            start = await stream.until("turn_start")
        assert start.seq == count + 1
        await server.terminate()


async def expect_out_of_range(server: Server, agent_id: str, session_id: str, seq: int) -> None:
    stream = EventStream(server.agents, agent_id=agent_id, session_id=session_id, from_seq=seq)
    with stream, pytest.raises(grpc.aio.AioRpcError) as refused:
        await stream.next()
    assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "from_seq" in (refused.value.details() or "")
