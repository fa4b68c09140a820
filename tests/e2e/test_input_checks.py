"""Input checks at the API: WaitIdle as a poll, content errors naming the right field."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2
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
