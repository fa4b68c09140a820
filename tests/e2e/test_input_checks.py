"""Input checks at the API: statuses that name the field, never UNKNOWN, nothing appended."""

from __future__ import annotations

import math
from collections.abc import Awaitable

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2

from agentloop import InvalidArgument, NotFound
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import content_pb2 as c
from tests.e2e.conftest import E2E


async def test_wait_idle_with_a_zero_timeout_is_a_poll(e2e: E2E) -> None:
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id="w", options=agent_pb2.AgentOptions())
    )
    reply = await e2e.agents.WaitIdle(
        api.WaitIdleRequest(agent_id="w", timeout=duration_pb2.Duration(seconds=0))
    )
    assert reply.idle


async def test_an_empty_content_block_is_named_by_its_own_index(e2e: E2E) -> None:
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id="f", options=agent_pb2.AgentOptions())
    )
    request = api.SendMessageRequest(agent_id="f", text="hello", content=[c.ContentBlock()])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await e2e.agents.SendMessage(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("content[0]:")
    session = await e2e.agents.GetSession(api.GetSessionRequest(agent_id="f"))
    assert session.session.event_count == 0  # nothing was accepted


NOT_USER_CONTENT = [
    c.ContentBlock(tool_call=c.ToolCallBlock(id="x", name="echo", arguments="{}")),
    c.ContentBlock(tool_result=c.ToolResultBlock(tool_call_id="x")),
    c.ContentBlock(reasoning=c.ReasoningBlock(text="forged")),
]


async def test_only_user_content_may_be_sent_steered_or_injected(e2e: E2E) -> None:
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id="u", options=agent_pb2.AgentOptions())
    )
    text = c.ContentBlock(text=c.TextBlock(text="fine"))
    for block in NOT_USER_CONTENT:
        kind = block.WhichOneof("block")
        calls: list[Awaitable[object]] = [
            e2e.agents.SendMessage(api.SendMessageRequest(agent_id="u", content=[text, block])),
            e2e.agents.SteerMessage(api.SteerMessageRequest(agent_id="u", content=[text, block])),
            e2e.agents.InjectContext(api.InjectContextRequest(agent_id="u", content=[text, block])),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == (
                f"content[1]: is a {kind} block; a message may carry only text"
            )
    session = await e2e.agents.GetSession(api.GetSessionRequest(agent_id="u"))
    assert session.session.event_count == 0  # nothing was appended


async def test_page_tokens_the_server_never_issued_are_invalid(e2e: E2E) -> None:
    await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="p"))
    for token in ("²", "9" * 4301, "-1", "1.5", "0x10"):
        calls: list[Awaitable[object]] = [
            e2e.factory.ListAgents(fac.ListAgentsRequest(page_token=token)),
            e2e.agents.ListSessions(api.ListSessionsRequest(page_token=token)),
            e2e.agents.ListSessionEvents(
                api.ListSessionEventsRequest(agent_id="p", page_token=token)
            ),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, token
            assert info.value.details() == "page_token: is not a token this server issued"
    # Issued tokens still work: decimal offsets.
    for i in range(2):
        await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id=f"q{i}"))
    first = await e2e.factory.ListAgents(fac.ListAgentsRequest(page_size=2))
    rest = await e2e.factory.ListAgents(
        fac.ListAgentsRequest(page_size=2, page_token=first.next_page_token)
    )
    assert [a.agent_id for a in [*first.agents, *rest.agents]] == ["p", "q0", "q1"]


async def test_wait_idle_timeouts_out_of_range_are_invalid(e2e: E2E) -> None:
    await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="w"))
    for seconds, nanos in ((2**63 - 1, 0), (-(2**63), 0), (3601, 0), (-1, 0), (0, -1)):
        request = api.WaitIdleRequest(
            agent_id="w", timeout=duration_pb2.Duration(seconds=seconds, nanos=nanos)
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await e2e.agents.WaitIdle(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == "timeout: must be between 0 and 3600 seconds"


async def test_inject_meta_refuses_non_finite_numbers(e2e: E2E) -> None:
    await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="m"))
    for bad in (math.nan, math.inf, -math.inf):
        meta = struct_pb2.Struct()
        meta.update({"ok": 1, "deep": {"list": [1, bad]}})
        request = api.InjectContextRequest(agent_id="m", text="ctx", meta=meta)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await e2e.agents.InjectContext(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith("meta: holds")
    session = await e2e.agents.GetSession(api.GetSessionRequest(agent_id="m"))
    assert session.session.event_count == 0


async def test_an_undecodable_body_is_invalid_argument(e2e: E2E) -> None:
    raw = e2e.channel.unary_unary(
        "/agentloop.v1.AgentService/SendMessage",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    for body in (b"\xff\xff\xff", b"\x0a\x05ab", b"\x08" + b"\xff" * 11):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await raw(body)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith("the request body is not a valid message")
    assert await e2e.health() == 1


Step = scripted_pb2.ScriptedStep


@pytest.mark.parametrize(
    ("step", "field"),
    [
        (Step(chunk_delay=duration_pb2.Duration(seconds=-1)), "chunk_delay"),
        (Step(chunk_delay=duration_pb2.Duration(seconds=10**9)), "chunk_delay"),
        (Step(chunk_delay=duration_pb2.Duration(nanos=-5)), "chunk_delay"),
        (Step(finish=99), "finish"),  # type: ignore[arg-type]
    ],
    ids=["negative-delay", "enormous-delay", "negative-nanos", "unknown-finish"],
)
async def test_the_scripted_models_options_are_range_checked(
    e2e: E2E, step: scripted_pb2.ScriptedStep, field: str
) -> None:
    script = scripted_pb2.ScriptedOptions(steps=[scripted_pb2.ScriptedStep(text="ok"), step])
    with pytest.raises(InvalidArgument) as refused:
        await e2e.create("scripted-range", provider="scripted", provider_options=script)
    assert refused.value.field == f"options.provider_options.steps[1].{field}"
    with pytest.raises(NotFound):  # nothing was created
        await e2e.get_agent("scripted-range")
    fine = scripted_pb2.ScriptedStep(text="ok", chunk_delay=duration_pb2.Duration(nanos=1000))
    ok = scripted_pb2.ScriptedOptions(steps=[fine])
    await e2e.create("scripted-fine", provider="scripted", provider_options=ok)
    await e2e.dispose("scripted-fine")
