"""Shared helpers of the sub-agent tests: scripted options, creation, reading, refusals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from agentloop.client import Client
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.models.scripted_options import script_options
from tests.e2e.conftest import READ_TIMEOUT

T = READ_TIMEOUT


def calling(*calls: tuple[str, str, dict[str, object]]) -> scripted_pb2.ScriptedStep:
    """A scripted step making tool calls (id, name, arguments)."""
    return scripted_pb2.ScriptedStep(
        tool_calls=[
            scripted_pb2.ScriptedToolCall(id=i, name=n, arguments=json.dumps(a))
            for i, n, a in calls
        ]
    )


def says(text: str, delay_ms: int = 0) -> scripted_pb2.ScriptedStep:
    """A scripted step answering `text`, one character every `delay_ms`."""
    step = scripted_pb2.ScriptedStep(text=text, chunk_size=1)
    if delay_ms:
        step.chunk_delay.CopyFrom(duration_pb2.Duration(nanos=delay_ms * 10**6))
    return step


def scripted(
    *steps: scripted_pb2.ScriptedStep, tools: tuple[str, ...] = ()
) -> agent_pb2.AgentOptions:
    return agent_pb2.AgentOptions(
        provider="scripted", model="m", provider_options=script_options(list(steps)), tools=tools
    )


async def create(
    e2e: Client,
    agent_id: str,
    options: agent_pb2.AgentOptions | None = None,
    *,
    parent: str = "",
    call: str = "",
    seed: fac.SessionSeed | None = None,
) -> agent_pb2.Agent:
    request = fac.CreateAgentRequest(agent_id=agent_id, options=options or scripted())
    if parent:
        request.parent.CopyFrom(fac.AgentParent(agent_id=parent, tool_call_id=call))
    if seed is not None:
        request.seed.CopyFrom(seed)
    return (await e2e.factory.CreateAgent(request, timeout=T)).agent


async def get(e2e: Client, agent_id: str) -> agent_pb2.Agent:
    return (await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id=agent_id), timeout=T)).agent


async def children(e2e: Client, parent: str) -> list[str]:
    listed = await e2e.factory.ListAgents(fac.ListAgentsRequest(parent_agent_id=parent), timeout=T)
    return [a.agent_id for a in listed.agents]


async def send(e2e: Client, agent_id: str, text: str = "go") -> int:
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id=agent_id, text=text), timeout=T
    )
    return sent.next_seq


async def wait_idle(e2e: Client, agent_id: str) -> None:
    await e2e.agents.WaitIdle(api.WaitIdleRequest(agent_id=agent_id), timeout=T)


async def session_events(e2e: Client, session_id: str) -> list[ev.SessionEvent]:
    page = await e2e.agents.ListSessionEvents(
        api.ListSessionEventsRequest(session_id=session_id, page_size=5000), timeout=T
    )
    return list(page.events)


async def until(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll `predicate` until it is true; fail naming `what` after the read timeout."""
    try:
        async with asyncio.timeout(T):
            while not await predicate():  # noqa: ASYNC110 - a server state, polled over the API
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def refused(call_: object) -> tuple[grpc.StatusCode, error_details_pb2.ErrorInfo, str]:
    """The status code, ErrorInfo and named field (BadRequest, else "") of a refused call."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call_  # type: ignore[misc]
    error = caught.value
    details = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    info = error_details_pb2.ErrorInfo()
    field = ""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            detail.Unpack(info)
        bad = error_details_pb2.BadRequest()
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            detail.Unpack(bad)
            field = bad.field_violations[0].field
    return error.code(), info, field


def turn_ends(events: list[ev.SessionEvent]) -> list[str]:
    return [str(e.turn_end.reason.WhichOneof("kind")) for e in events if e.HasField("turn_end")]
