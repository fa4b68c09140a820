"""End-to-end tests of the two services through a real server and the generated stubs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, decision_pb2, scripted_pb2, session_event_pb2, stream_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.kernel import seams as S
from server.models.scripted_options import script_options
from tests.e2e.conftest import E2E, READ_TIMEOUT, EventStream, kinds, of_kind, read_turn, text_of

T = READ_TIMEOUT
"""The deadline of every unary call."""

SLOW_TEXT = "This reply streams one character every fifty milliseconds. " * 4


def options(
    script: list[scripted_pb2.ScriptedStep] | None = None, tools: list[str] | None = None
) -> agent_pb2.AgentOptions:
    """Scripted-model options."""
    return agent_pb2.AgentOptions(
        provider="scripted",
        model="m",
        provider_options=script_options(script or []),
        tools=tools or [],
    )


def millis(ms: int) -> duration_pb2.Duration:
    """A Duration of `ms` milliseconds."""
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def slow_step(ms: int = 50) -> scripted_pb2.ScriptedStep:
    """A long text streamed one character per `ms` milliseconds."""
    return scripted_pb2.ScriptedStep(text=SLOW_TEXT, chunk_delay=millis(ms))


async def create(
    e2e: E2E, agent_id: str, opts: agent_pb2.AgentOptions | None = None
) -> agent_pb2.Agent:
    """Create an agent (default: scripted, echoing)."""
    response = await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id=agent_id, options=opts or options()), timeout=T
    )
    assert response.agent.agent_id == agent_id
    return response.agent


async def send(e2e: E2E, agent_id: str, text: str) -> int:
    """Send a message; returns next_seq."""
    response = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id=agent_id, text=text), timeout=T
    )
    return response.next_seq


async def event_count(e2e: E2E, agent_id: str) -> int:
    """The length of the agent's session log."""
    response = await e2e.agents.GetSession(api.GetSessionRequest(agent_id=agent_id), timeout=T)
    return response.session.event_count


async def wait_idle(e2e: E2E, agent_id: str) -> api.WaitIdleResponse:
    """WaitIdle with a 5 s server-side timeout; asserts it became idle."""
    response = await e2e.agents.WaitIdle(
        api.WaitIdleRequest(agent_id=agent_id, timeout=millis(5000)), timeout=T
    )
    assert response.idle, f"agent {agent_id} did not become idle"
    return response


async def list_all(e2e: E2E, **request: Any) -> list[session_event_pb2.SessionEvent]:
    """Every event of a session via ListSessionEvents (one big page)."""
    response = await e2e.agents.ListSessionEvents(
        api.ListSessionEventsRequest(page_size=5000, **request), timeout=T
    )
    assert response.next_page_token == ""
    return list(response.events)


def reason_of(event: session_event_pb2.SessionEvent) -> str:
    """The turn-end reason kind of a `turn_end` event."""
    assert event.WhichOneof("payload") == "turn_end", event
    return str(event.turn_end.reason.WhichOneof("kind"))


def assert_contiguous(events: list[session_event_pb2.SessionEvent], start: int) -> None:
    """The events carry seqs start, start+1, ... with no gap or repeat."""
    assert [e.seq for e in events] == list(range(start, start + len(events)))


# -- turns ------------------------------------------------------------------------------


async def test_simple_turn_has_the_canonical_sequence(e2e: E2E) -> None:
    await create(e2e, "a1", options([scripted_pb2.ScriptedStep(text="hi there", chunk_size=3)]))
    next_seq = await send(e2e, "a1", "hello")
    assert next_seq == 1  # sequence numbers start at 1

    events = await read_turn(e2e.agents, "a1", next_seq)

    # "hi there" in pieces of 3: block start, 3 deltas, block end, finish.
    assert kinds(events) == [
        "turn_start",
        "user_message",
        "step_start",
        "request_header",
        *["assistant_chunk"] * 6,
        "assistant_message",
        "step_end",
        "turn_end",
    ]
    assert_contiguous(events, next_seq)
    start, user, step_start, header = events[:4]
    assert start.turn_start.turn == 1
    assert start.turn_start.trigger == session_event_pb2.TRIGGER_KIND_MESSAGE
    assert text_of(user.user_message.content) == "hello"
    assert user.user_message.source.kind == "user"
    assert (step_start.step_start.turn, step_start.step_start.step) == (1, 1)
    assert header.request_header.reason == session_event_pb2.HEADER_REASON_INITIAL
    assert header.request_header.header.config.provider == "scripted"
    assert header.request_header.header.config.model == "m"
    message = events[-3].assistant_message
    assert text_of(message.content) == "hi there"
    assert message.provenance.model == "m"
    assert list(events[-3].source_event_seqs) == [e.seq for e in of_kind(events, "assistant_chunk")]
    assert reason_of(events[-1]) == "completed"
    assert events[-1].turn_end.turn == 1


async def test_tool_round_trip(e2e: E2E) -> None:
    await create(e2e, "t1", options(tools=["word_count"]))
    next_seq = await send(e2e, "t1", "three little words")

    events = await read_turn(e2e.agents, "t1", next_seq)

    k = kinds(events)
    assert k.count("step_start") == 2
    assert k.count("step_end") == 2
    assert k.count("assistant_message") == 2
    (call,) = of_kind(events, "tool_call")
    (result,) = of_kind(events, "tool_result")
    assert call.tool_call.name == "word_count"
    assert result.tool_result.call_id == call.tool_call.call_id
    assert not result.tool_result.is_error
    assert text_of(result.tool_result.content) == "3 words"
    assert list(result.source_event_seqs) == [call.seq]
    first_step_end = k.index("step_end")
    assert k.index("tool_call") < k.index("tool_result") < first_step_end
    final = of_kind(events, "assistant_message")[-1].assistant_message
    assert final.step == 2
    assert text_of(final.content) == "Tool results: 3 words"
    assert reason_of(events[-1]) == "completed"


async def test_steering_joins_the_running_step(e2e: E2E) -> None:
    script = [
        scripted_pb2.ScriptedStep(
            tool_calls=[
                scripted_pb2.ScriptedToolCall(id="s1", name="sleep", arguments='{"seconds": 0.3}')
            ]
        ),
        scripted_pb2.ScriptedStep(text="steered answer"),
    ]
    await create(e2e, "st1", options(script, tools=["sleep"]))
    next_seq = await send(e2e, "st1", "start")
    with EventStream(e2e.agents, agent_id="st1", from_seq=next_seq) as stream:
        await stream.until("tool_call")
        steer = await e2e.agents.SteerMessage(
            api.SteerMessageRequest(agent_id="st1", text="also do this"), timeout=T
        )
        assert steer.steering is True
        await stream.until("turn_end")

    events = stream.events
    k = kinds(events)
    assert_contiguous(events, next_seq)
    assert k.count("step_start") == 2
    (steering,) = of_kind(events, "steering_message")
    assert text_of(steering.steering_message.content) == "also do this"
    assert steering.steering_message.turn == 1
    # Steering that arrives during the tool batch is drained inside step 1.
    assert k.index("tool_result") < k.index("steering_message") < k.index("step_end")
    second = [e for e in of_kind(events, "assistant_message") if e.assistant_message.step == 2]
    assert len(second) == 1
    assert text_of(second[0].assistant_message.content) == "steered answer"
    assert reason_of(events[-1]) == "completed"


async def test_cancel_mid_stream_aborts_the_turn(e2e: E2E) -> None:
    await create(e2e, "c1", options([slow_step(50)]))
    next_seq = await send(e2e, "c1", "talk slowly")
    with EventStream(e2e.agents, agent_id="c1", from_seq=next_seq) as stream:
        await stream.until("assistant_chunk")
        cancel = await e2e.agents.CancelTurn(
            api.CancelTurnRequest(agent_id="c1", reason="user interrupt"), timeout=T
        )
        assert cancel.cancelled is True
        end = await stream.until("turn_end")

    assert reason_of(end) == "aborted"
    assert end.turn_end.reason.aborted.reason == "user interrupt"
    k = kinds(stream.events)
    assert "assistant_message" not in k
    assert k[-2:] == ["step_end", "turn_end"]
    # Fewer chunks than the whole reply: the stream really was cut.
    assert k.count("assistant_chunk") < len(SLOW_TEXT)

    await wait_idle(e2e, "c1")
    count = await event_count(e2e, "c1")
    idle_cancel = await e2e.agents.CancelTurn(api.CancelTurnRequest(agent_id="c1"), timeout=T)
    assert idle_cancel.cancelled is False
    assert await event_count(e2e, "c1") == count


async def test_blocked_prompt_rejects_the_turn(e2e: E2E) -> None:
    seen: list[tuple[str, str, str]] = []

    async def listener(call: S.PromptSubmit, next: object) -> decision_pb2.PromptDecision:
        seen.append((call.agent_id, text_of(call.content), call.source.kind))
        return decision_pb2.PromptDecision(block=decision_pb2.PromptBlock(reason="nope"))

    remove = e2e.app.runtime.seams.on(S.PROMPT_SUBMIT, listener)
    try:
        await create(e2e, "b1")
        next_seq = await send(e2e, "b1", "forbidden words")
        events = await read_turn(e2e.agents, "b1", next_seq)
    finally:
        remove()

    assert seen == [("b1", "forbidden words", "user")]
    assert kinds(events) == ["turn_start", "prompt_blocked", "turn_end"]
    blocked = events[1].prompt_blocked
    assert blocked.reason == "nope"
    assert text_of(blocked.content) == "forbidden words"
    assert reason_of(events[2]) == "rejected"
    assert events[2].turn_end.reason.rejected.reason == "nope"


async def test_max_tokens_drops_tool_calls(e2e: E2E) -> None:
    script = [
        scripted_pb2.ScriptedStep(
            text="truncated",
            tool_calls=[
                scripted_pb2.ScriptedToolCall(id="e1", name="echo", arguments='{"text": "x"}')
            ],
            finish=stream_pb2.FINISH_KIND_MAX_TOKENS,
        )
    ]
    await create(e2e, "m1", options(script, tools=["echo"]))
    next_seq = await send(e2e, "m1", "go")

    events = await read_turn(e2e.agents, "m1", next_seq)

    k = kinds(events)
    assert "tool_call" not in k
    assert "tool_result" not in k
    assert k.count("step_start") == 1
    (message,) = of_kind(events, "assistant_message")
    assert [b.WhichOneof("block") for b in message.assistant_message.content] == ["text"]
    assert text_of(message.assistant_message.content) == "truncated"
    assert reason_of(events[-1]) == "max_tokens"


# -- rejected calls ---------------------------------------------------------------------

WITNESS = "w1"
"""The agent whose session must stay untouched by every rejected call."""


@dataclass(frozen=True)
class Rejected:
    """A call the server must reject, and how."""

    call: Callable[[E2E], Awaitable[Any]]
    code: grpc.StatusCode
    names: tuple[str, ...]
    """Strings the status details must contain (the field, or the id)."""
    setup: Callable[[E2E], Awaitable[Any]] | None = None
    absent: str = ""
    """An agent id that must not exist after the call."""


def _create(agent_id: str, opts: agent_pb2.AgentOptions) -> Callable[[E2E], Awaitable[Any]]:
    def call(e2e: E2E) -> Awaitable[Any]:
        return e2e.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id=agent_id, options=opts), timeout=T
        )

    return call


def _send(agent_id: str, text: str) -> Callable[[E2E], Awaitable[Any]]:
    def call(e2e: E2E) -> Awaitable[Any]:
        return e2e.agents.SendMessage(
            api.SendMessageRequest(agent_id=agent_id, text=text), timeout=T
        )

    return call


def _options_with_cap(cap: int) -> agent_pb2.AgentOptions:
    opts = options()
    opts.max_parallel_tool_calls = cap
    return opts


async def _create_and_dispose(e2e: E2E) -> None:
    await create(e2e, "d1")
    await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="d1"), timeout=T)


INVALID = grpc.StatusCode.INVALID_ARGUMENT

REJECTED = {
    "create-empty-id": Rejected(_create("", options()), INVALID, ("agent_id",)),
    "create-malformed-id": Rejected(
        _create("bad id!", options()), INVALID, ("agent_id", "bad id!")
    ),
    "send-unknown-agent": Rejected(_send("ghost", "hi"), grpc.StatusCode.NOT_FOUND, ("ghost",)),
    "create-duplicate": Rejected(
        _create(WITNESS, options()), grpc.StatusCode.ALREADY_EXISTS, (WITNESS,)
    ),
    "send-without-text": Rejected(_send(WITNESS, ""), INVALID, ("text",)),
    "create-zero-parallel-cap": Rejected(
        _create("x1", _options_with_cap(0)), INVALID, ("max_parallel_tool_calls",), absent="x1"
    ),
    "create-unknown-provider": Rejected(
        _create("x2", agent_pb2.AgentOptions(provider="no-such-provider", model="m")),
        INVALID,
        ("options.provider", "no-such-provider"),
        absent="x2",
    ),
    "create-unknown-tool": Rejected(
        _create("x3", options(tools=["word_count", "rm_rf"])),
        INVALID,
        ("options.tools", "rm_rf"),
        absent="x3",
    ),
    "send-after-dispose": Rejected(
        _send("d1", "anyone there?"),
        grpc.StatusCode.FAILED_PRECONDITION,
        ("d1", "disposed"),
        setup=_create_and_dispose,
    ),
}


@pytest.mark.parametrize("case", REJECTED.values(), ids=REJECTED.keys())
async def test_rejected_call_changes_nothing(e2e: E2E, case: Rejected) -> None:
    await create(e2e, WITNESS)
    await read_turn(e2e.agents, WITNESS, await send(e2e, WITNESS, "warm up"))
    await wait_idle(e2e, WITNESS)
    if case.setup is not None:
        await case.setup(e2e)
    before_count = await event_count(e2e, WITNESS)
    before_agents = await e2e.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await case.call(e2e)

    assert info.value.code() == case.code, info.value.details()
    details = info.value.details() or ""
    for name in case.names:
        assert name in details, f"{name!r} not in {details!r}"
    # Nothing changed: no event, no agent.
    assert await event_count(e2e, WITNESS) == before_count
    after_agents = await e2e.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
    assert after_agents == before_agents
    if case.absent:
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id=case.absent), timeout=T)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    # The server still serves: a valid turn completes and answers exactly one message.
    next_seq = await send(e2e, WITNESS, "still there?")
    assert next_seq == before_count + 1
    events = await read_turn(e2e.agents, WITNESS, next_seq)
    assert reason_of(events[-1]) == "completed"
    users = of_kind(events, "user_message")
    assert [text_of(u.user_message.content) for u in users] == ["still there?"]


# -- reading sessions -------------------------------------------------------------------


async def test_list_session_events_pages(e2e: E2E) -> None:
    await create(e2e, "p1", options(tools=["word_count"]))
    await read_turn(e2e.agents, "p1", await send(e2e, "p1", "count these four words"))
    await wait_idle(e2e, "p1")
    total = await event_count(e2e, "p1")
    assert total > 6

    pages: list[list[session_event_pb2.SessionEvent]] = []
    token = ""
    while True:
        page = await e2e.agents.ListSessionEvents(
            api.ListSessionEventsRequest(agent_id="p1", page_size=3, page_token=token), timeout=T
        )
        pages.append(list(page.events))
        token = page.next_page_token
        if not token:
            break
        assert len(pages) <= total, "pagination does not terminate"

    assert len(pages) == -(-total // 3)
    assert all(len(p) == 3 for p in pages[:-1])
    assert 1 <= len(pages[-1]) <= 3
    flat = [e for p in pages for e in p]
    assert_contiguous(flat, 1)
    assert len(flat) == total
    assert flat == await list_all(e2e, agent_id="p1")

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await e2e.agents.ListSessionEvents(
            api.ListSessionEventsRequest(agent_id="p1", page_size=3, page_token="bogus!"),
            timeout=T,
        )
    assert info.value.code() == INVALID
    assert "page_token" in (info.value.details() or "")


async def test_stream_resumes_after_disconnect(e2e: E2E) -> None:
    await create(e2e, "r1", options([slow_step(10)]))
    next_seq = await send(e2e, "r1", "stream me")

    # Leaving the block disconnects mid-turn.
    with EventStream(e2e.agents, agent_id="r1", from_seq=next_seq) as first:
        while len(first.events) < 5:
            assert await first.next() is not None
    assert first.call.cancelled()
    assert "turn_end" not in kinds(first.events)
    last_seen = first.events[-1].seq

    rest = await read_turn(e2e.agents, "r1", last_seen + 1)

    joined = first.events + rest
    assert_contiguous(joined, next_seq)
    assert kinds(joined)[-1] == "turn_end"
    await wait_idle(e2e, "r1")
    logged = await list_all(e2e, agent_id="r1", from_seq=next_seq)
    assert joined == logged[: len(joined)]
    assert reason_of(joined[-1]) == "completed"


async def test_stream_carries_live_agent_events(e2e: E2E) -> None:
    await create(e2e, "ev1")
    await read_turn(e2e.agents, "ev1", await send(e2e, "ev1", "first"))
    await wait_idle(e2e, "ev1")

    with EventStream(e2e.agents, agent_id="ev1", from_seq=0) as stream:
        await stream.until("turn_start")  # replaying: the subscription is in place
        await send(e2e, "ev1", "second")
        await stream.until("turn_end")  # the end of turn 1 (replayed)
        second_end = await stream.until("turn_end")
        await stream.until_agent_event(
            lambda e: e.WhichOneof("event") == "status" and e.status.status == ae.AGENT_STATUS_IDLE
        )

    assert second_end.turn_end.turn == 2
    assert all(e.agent_id == "ev1" for e in stream.agent_events)
    statuses = [e.status.status for e in stream.agent_events if e.WhichOneof("event") == "status"]
    assert statuses == [ae.AGENT_STATUS_RUNNING, ae.AGENT_STATUS_IDLE]
    queued = [e.queued for e in stream.agent_events if e.WhichOneof("event") == "queued"]
    assert len(queued) == 1
    assert text_of(queued[0].content) == "second"
    assert queued[0].steering is False

    replay = EventStream(e2e.agents, agent_id="ev1", from_seq=0, replay_only=True)
    await replay.drain()  # ends by itself
    assert replay.ended
    assert await replay.call.code() == grpc.StatusCode.OK
    assert replay.events == await list_all(e2e, agent_id="ev1")
    assert replay.agent_events == []


async def test_agents_wait_idle_and_sessions(e2e: E2E) -> None:
    created = {}
    for agent_id in ("lc", "la", "lb"):
        created[agent_id] = await create(e2e, agent_id)
    got = await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id="lb"), timeout=T)
    assert got.agent.agent_id == "lb"
    assert got.agent.session_id == created["lb"].session_id
    assert got.agent.session_id.startswith("lb-session-")
    assert got.agent.status == ae.AGENT_STATUS_IDLE
    assert got.agent.options == options()
    assert got.agent.create_time.seconds > 0

    page1 = await e2e.factory.ListAgents(fac.ListAgentsRequest(page_size=2), timeout=T)
    assert [a.agent_id for a in page1.agents] == ["la", "lb"]
    assert page1.next_page_token
    page2 = await e2e.factory.ListAgents(
        fac.ListAgentsRequest(page_size=2, page_token=page1.next_page_token), timeout=T
    )
    assert [a.agent_id for a in page2.agents] == ["lc"]
    assert page2.next_page_token == ""
    everything = await e2e.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
    assert [a.agent_id for a in everything.agents] == ["la", "lb", "lc"]

    # WaitIdle right after a send waits for the whole turn.
    await send(e2e, "la", "hello")
    idle = await wait_idle(e2e, "la")
    assert idle.status == ae.AGENT_STATUS_IDLE
    logged = await list_all(e2e, agent_id="la")
    assert idle.next_seq == len(logged) + 1
    assert reason_of(logged[-1]) == "completed"

    # GetSession by agent and by session id describe the same session.
    by_agent = await e2e.agents.GetSession(api.GetSessionRequest(agent_id="la"), timeout=T)
    by_id = await e2e.agents.GetSession(
        api.GetSessionRequest(session_id=created["la"].session_id), timeout=T
    )
    assert by_agent.session == by_id.session
    assert by_agent.session.session_id == created["la"].session_id
    assert by_agent.session.agent_id == "la"
    assert by_agent.session.event_count == len(logged)
    assert by_agent.session.turn_count == 1
    assert by_agent.session.header.create_time.seconds > 0

    # A slow turn and a tiny timeout: not idle.
    await create(e2e, "slow", options([slow_step(50)]))
    await send(e2e, "slow", "take your time")
    busy = await e2e.agents.WaitIdle(
        api.WaitIdleRequest(agent_id="slow", timeout=millis(50)), timeout=T
    )
    assert busy.idle is False
    assert busy.status == ae.AGENT_STATUS_RUNNING
    cancel = await e2e.agents.CancelTurn(api.CancelTurnRequest(agent_id="slow"), timeout=T)
    assert cancel.cancelled is True
    await wait_idle(e2e, "slow")


async def test_an_agent_says_the_provider_and_model_its_requests_use(e2e: E2E) -> None:
    """Options that leave provider and model empty get the server's defaults, and the
    agent says which (`resolved_provider`, `resolved_model`); its requests use them."""
    bare = await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="bare"), timeout=T)
    assert (bare.agent.options.provider, bare.agent.options.model) == ("", "")
    assert (bare.agent.resolved_provider, bare.agent.resolved_model) == ("scripted", "echo")
    half = agent_pb2.AgentOptions(provider="scripted")  # the provider's default model
    await create(e2e, "half", half)
    await create(e2e, "named")  # scripted, model "m"
    listed = await e2e.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
    resolved = {a.agent_id: (a.resolved_provider, a.resolved_model) for a in listed.agents}
    assert resolved == {
        "bare": ("scripted", "echo"),
        "half": ("scripted", "echo"),
        "named": ("scripted", "m"),
    }
    await send(e2e, "bare", "hello")
    await wait_idle(e2e, "bare")
    [header] = of_kind(await list_all(e2e, agent_id="bare"), "request_header")
    config = header.request_header.header.config
    assert (config.provider, config.model) == ("scripted", "echo")


async def test_dispose_during_a_turn(e2e: E2E) -> None:
    agent = await create(e2e, "dx", options([slow_step(50)]))
    next_seq = await send(e2e, "dx", "long answer please")
    with EventStream(e2e.agents, agent_id="dx", from_seq=next_seq) as stream:
        await stream.until("assistant_chunk")
        disposed = await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="dx"), timeout=T)
        assert disposed.agent.status == ae.AGENT_STATUS_DISPOSED
        await stream.drain()  # the live stream ends by itself
    assert await stream.call.code() == grpc.StatusCode.OK
    assert reason_of(stream.events[-1]) == "disposed"
    assert any(e.WhichOneof("event") == "disposed" for e in stream.agent_events)

    logged = await list_all(e2e, session_id=agent.session_id)
    assert logged[-1] == stream.events[-1]
    assert reason_of(logged[-1]) == "disposed"
    turn = logged[next_seq - 1 :]
    assert kinds(turn)[-2:] == ["step_end", "turn_end"]
    assert "assistant_message" not in kinds(turn)
    session = await e2e.agents.GetSession(
        api.GetSessionRequest(session_id=agent.session_id), timeout=T
    )
    assert session.session.agent_id == ""
    assert session.session.event_count == len(logged)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id="dx"), timeout=T)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


# -- health -----------------------------------------------------------------------------


async def test_health_serving_then_not_serving_on_stop(e2e: E2E) -> None:
    # The typeshed stub of HealthStub declares no methods.
    health: Any = health_pb2_grpc.HealthStub(e2e.channel)
    for service in ("", "agentloop.v1.AgentService", "agentloop.v1.AgentFactoryService"):
        response = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=T)
        assert response.status == health_pb2.HealthCheckResponse.SERVING, service

    watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
    try:
        async with asyncio.timeout(T):
            first = await watch.read()
        assert isinstance(first, health_pb2.HealthCheckResponse)
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.create_task(e2e.app.stop(grace=1))
        async with asyncio.timeout(T):
            second = await watch.read()
        assert isinstance(second, health_pb2.HealthCheckResponse)
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        async with asyncio.timeout(T):
            await stopping
    finally:
        watch.cancel()

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=T)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_stream_drains_the_log_when_disposed_behind_live_events(e2e: E2E) -> None:
    """The stream must deliver `turn_end` even when it is busy with live events at disposal."""
    agent = await create(e2e, "dy", options([slow_step(50)]))
    next_seq = await send(e2e, "dy", "long answer please")
    with EventStream(e2e.agents, agent_id="dy", from_seq=next_seq) as stream:
        await stream.until("assistant_chunk")
        # Large accepted messages: each is a live `queued` event of 1 MB that the stream
        # relays. The test reads nothing meanwhile, so the stream is still writing them
        # (held by flow control) when the agent is disposed.
        for i in range(8):
            await send(e2e, "dy", f"{i}" * 1_000_000)
        await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="dy"), timeout=T)
        await stream.drain()
    assert await stream.call.code() == grpc.StatusCode.OK
    logged = await list_all(e2e, session_id=agent.session_id)
    assert reason_of(logged[-1]) == "disposed"
    assert stream.events == logged[next_seq - 1 :], "the stream ended before the log was drained"


async def test_a_disposed_agent_is_failed_precondition_until_its_id_is_reused(e2e: E2E) -> None:
    await create(e2e, "gone", options())
    await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="gone"), timeout=T)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "SendMessage": lambda: e2e.agents.SendMessage(
            api.SendMessageRequest(agent_id="gone", text="hi"), timeout=T
        ),
        "SteerMessage": lambda: e2e.agents.SteerMessage(
            api.SteerMessageRequest(agent_id="gone", text="hi"), timeout=T
        ),
        "InjectContext": lambda: e2e.agents.InjectContext(
            api.InjectContextRequest(agent_id="gone", text="hi"), timeout=T
        ),
        "CancelTurn": lambda: e2e.agents.CancelTurn(
            api.CancelTurnRequest(agent_id="gone"), timeout=T
        ),
        "GetAgent": lambda: e2e.factory.GetAgent(fac.GetAgentRequest(agent_id="gone"), timeout=T),
        "DisposeAgent": lambda: e2e.factory.DisposeAgent(
            fac.DisposeAgentRequest(agent_id="gone"), timeout=T
        ),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call()
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, name
        assert "disposed" in (info.value.details() or ""), name
    # An id that never existed is still NOT_FOUND; a reused id is live again.
    with pytest.raises(grpc.aio.AioRpcError) as never:
        await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id="never-was"), timeout=T)
    assert never.value.code() == grpc.StatusCode.NOT_FOUND
    await create(e2e, "gone", options())
    again = await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id="gone"), timeout=T)
    assert again.agent.status == ae.AGENT_STATUS_IDLE


async def test_send_message_reports_running_for_the_message_that_wakes_the_agent(
    e2e: E2E,
) -> None:
    await create(e2e, "waker", options([slow_step(5)]))
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id="waker", text="wake up"), timeout=T
    )
    assert sent.status == ae.AGENT_STATUS_RUNNING
    await wait_idle(e2e, "waker")
