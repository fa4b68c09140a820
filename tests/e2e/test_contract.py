"""The contract rules of agentloop.v1, each through a real server.

Error details (AIP-193), `oneof` selectors, keyset page tokens bound to their
parameters, a stream that confirms its subscription and counts what it drops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, struct_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.edge import api_agent
from server.models.scripted_options import script_options
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, EventStream, running_app

T = READ_TIMEOUT
DETAILS = "grpc-status-details-bin"


def details(error: grpc.aio.AioRpcError) -> tuple[Any, Any]:
    """The (ErrorInfo, BadRequest or None) of a refused call, from its trailer."""
    trailer = dict(error.trailing_metadata() or ())
    status = status_pb2.Status.FromString(trailer[DETAILS])
    assert status.code == error.code().value[0] and status.message == error.details()
    info, bad = None, None
    for packed in status.details:
        if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            packed.Unpack(info)
        elif packed.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            packed.Unpack(bad)
    assert info is not None and info.domain == "agentloop.v1"
    return info, bad


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def create(e2e: E2E, agent_id: str) -> None:
    short = [scripted_pb2.ScriptedStep(text="ok")] * 50  # not an echo of long prompts
    options = agent_pb2.AgentOptions(
        provider="scripted", model="m", provider_options=script_options(short)
    )
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id=agent_id, options=options), timeout=T
    )


async def test_errors_carry_error_info_and_the_bad_field(e2e: E2E) -> None:
    empty = await refused(e2e.agents.SendMessage(api.SendMessageRequest(text="hi"), timeout=T))
    info, bad = details(empty)
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "INVALID_FIELD"
    assert [v.field for v in bad.field_violations] == ["agent_id"]
    assert bad.field_violations[0].description  # says what is wrong with it

    unknown = await refused(
        e2e.agents.SendMessage(api.SendMessageRequest(agent_id="ghost", text="hi"), timeout=T)
    )
    info, bad = details(unknown)
    assert (info.reason, dict(info.metadata), bad) == (
        "AGENT_NOT_FOUND",
        {"agent_id": "ghost"},
        None,
    )

    await create(e2e, "gone")
    await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="gone"), timeout=T)
    disposed = await refused(
        e2e.agents.SendMessage(api.SendMessageRequest(agent_id="gone", text="hi"), timeout=T)
    )
    info, _ = details(disposed)
    assert disposed.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (info.reason, dict(info.metadata)) == ("AGENT_DISPOSED", {"agent_id": "gone"})

    missing = await refused(
        e2e.agents.GetSession(api.GetSessionRequest(session_id="nope"), timeout=T)
    )
    assert details(missing)[0].reason == "SESSION_NOT_FOUND"


async def test_a_request_without_its_selector_names_the_oneof(e2e: E2E) -> None:
    for call in (
        e2e.agents.GetSession(api.GetSessionRequest(), timeout=T),
        e2e.agents.ListSessionEvents(api.ListSessionEventsRequest(), timeout=T),
    ):
        error = await refused(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        _, bad = details(error)
        assert [v.field for v in bad.field_violations] == ["selector"]


async def test_agent_pages_neither_skip_nor_repeat_when_agents_come_and_go(e2e: E2E) -> None:
    for agent_id in ("k1", "k2", "k3", "k4"):
        await create(e2e, agent_id)
    first = await e2e.factory.ListAgents(fac.ListAgentsRequest(page_size=2), timeout=T)
    assert [a.agent_id for a in first.agents] == ["k1", "k2"]
    # With offsets, disposing k1 would shift k3 onto page one and page two would skip it.
    await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="k1"), timeout=T)
    await create(e2e, "k0")  # sorts before the token: not on a later page
    rest = await e2e.factory.ListAgents(
        fac.ListAgentsRequest(page_size=5, page_token=first.next_page_token), timeout=T
    )
    assert [a.agent_id for a in rest.agents] == ["k3", "k4"] and rest.next_page_token == ""
    assert not first.next_page_token.isdigit()  # opaque, not an offset


async def test_a_page_token_is_bound_to_its_method_and_parameters(e2e: E2E) -> None:
    await create(e2e, "pt")
    await e2e.agents.SendMessage(api.SendMessageRequest(agent_id="pt", text="hi"), timeout=T)
    await e2e.agents.WaitIdle(api.WaitIdleRequest(agent_id="pt"), timeout=T)
    page = await e2e.agents.ListSessionEvents(
        api.ListSessionEventsRequest(agent_id="pt", from_seq=2, page_size=2), timeout=T
    )
    assert [e.seq for e in page.events] == [2, 3] and page.next_page_token
    token = page.next_page_token
    # The same parameters, another page size: fine.
    more = await e2e.agents.ListSessionEvents(
        api.ListSessionEventsRequest(agent_id="pt", from_seq=2, page_size=3, page_token=token),
        timeout=T,
    )
    assert [e.seq for e in more.events] == [4, 5, 6]
    for changed in (
        api.ListSessionEventsRequest(agent_id="pt", from_seq=1, page_token=token),
        api.ListSessionEventsRequest(session_id="pt-x", from_seq=2, page_token=token),
    ):
        error = await refused(e2e.agents.ListSessionEvents(changed, timeout=T))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "keep them fixed across pages" in (error.details() or "")
        assert [v.field for v in details(error)[1].field_violations] == ["page_token"]
    other_method = await refused(
        e2e.factory.ListAgents(fac.ListAgentsRequest(page_token=token), timeout=T)
    )
    assert other_method.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_first_stream_response_confirms_the_subscription(e2e: E2E) -> None:
    await create(e2e, "sub")
    with EventStream(e2e.agents, agent_id="sub") as stream:
        first = await stream.next()
        assert first is not None and first.subscribed
        assert not first.events and not first.agent_events
        await e2e.agents.SendMessage(api.SendMessageRequest(agent_id="sub", text="hi"), timeout=T)
        end = await stream.until("turn_end")
        assert end.seq > 1 and stream.events[0].seq == 1


async def test_live_events_dropped_for_a_slow_reader_are_counted(
    e2e: E2E, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api_agent, "LIVE_EVENT_BUFFER", 4)
    await create(e2e, "slow")
    agent = e2e.app.factory.get("slow")
    with EventStream(e2e.agents, agent_id="slow") as stream:
        first = await stream.next()
        assert first is not None and first.subscribed
        emitted: list[ae.AgentEvent] = []
        agent.subscribe(emitted.append)  # after the stream's subscription: nothing between
        # The reader reads nothing meanwhile: each `queued` event carries 500 kB, so the
        # server's writes back up and its buffer of 4 live events overflows.
        for i in range(24):
            await e2e.agents.SendMessage(
                api.SendMessageRequest(agent_id="slow", text=f"{i % 10}" * 500_000), timeout=T
            )
        await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="slow"), timeout=T)
        dropped = 0
        while (batch := await stream.next()) is not None:
            dropped += batch.dropped_agent_events
    assert dropped > 0
    assert len(stream.agent_events) + dropped == len(emitted)


async def test_provider_options_of_another_type_are_refused(e2e: E2E) -> None:
    wrong = any_pb2.Any()
    wrong.Pack(struct_pb2.Struct())
    error = await refused(
        e2e.factory.CreateAgent(
            fac.CreateAgentRequest(
                agent_id="typed", options=agent_pb2.AgentOptions(provider_options=wrong)
            ),
            timeout=T,
        )
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "agentloop.v1.ScriptedOptions" in (error.details() or "")
    assert [v.field for v in details(error)[1].field_violations] == ["options.provider_options"]


async def test_resume_without_options_restores_the_stored_ones(tmp_path: Path) -> None:
    config = Config(listen="127.0.0.1:0", store="sqlite", data_dir=str(tmp_path), agents=())
    async with running_app(config) as server:
        options = agent_pb2.AgentOptions(provider="scripted", model="m", tools=["word_count"])
        created = await server.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="first", session_id="kept", options=options), timeout=T
        )
        assert created.agent.options == options
        busy = await refused(
            server.factory.ResumeAgent(
                fac.ResumeAgentRequest(agent_id="second", session_id="kept"), timeout=T
            )
        )
        info, _ = details(busy)
        assert busy.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert info.reason == "SESSION_IN_USE" and "DisposeAgent" in (busy.details() or "")
        await server.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="first"), timeout=T)
        resumed = await server.factory.ResumeAgent(
            fac.ResumeAgentRequest(agent_id="second", session_id="kept"), timeout=T
        )
        assert resumed.agent.options == options  # not the server defaults (no tools)
