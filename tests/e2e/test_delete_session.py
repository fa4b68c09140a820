"""DeleteSession through a real server on a real SQLite file, and the CLI verb."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from agentloop.v1 import agent_service_pb2 as api
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, running_app
from tests.test_cli import run_cli

T = READ_TIMEOUT


@pytest.fixture
async def durable(tmp_path: Path) -> AsyncIterator[E2E]:
    """A real server on a SQLite store in `tmp_path`, with no start-up agents."""
    config = Config(listen="127.0.0.1:0", data_dir=str(tmp_path), agents=())
    async with running_app(config) as running:
        yield running


async def refused(call: object) -> tuple[grpc.StatusCode, str, error_details_pb2.ErrorInfo]:
    """The status code, details and ErrorInfo of a refused call."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    error = caught.value
    details = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    info = error_details_pb2.ErrorInfo()
    assert status_pb2.Status.FromString(details).details[0].Unpack(info)
    return error.code(), error.details() or "", info


async def one_turn(e2e: E2E, agent_id: str, session_id: str) -> None:
    await e2e.create(agent_id, session_id=session_id)
    await e2e.send(agent_id, "hello there")
    assert (await e2e.wait_idle(agent_id)).idle


async def event_count(e2e: E2E, session_id: str) -> int:
    request = api.GetSessionRequest(session_id=session_id)
    return (await e2e.agents.GetSession(request, timeout=T)).session.event_count


async def test_a_live_session_is_refused_then_deleted_with_its_agent_disposed(
    durable: E2E, caplog: pytest.LogCaptureFixture
) -> None:
    e2e = durable
    await one_turn(e2e, "a1", "s1")
    await one_turn(e2e, "bystander", "s2")
    fork = await e2e.fork("s1", new_session_id="s1-copy")
    fork_events = await e2e.agents.ListSessionEvents(
        api.ListSessionEventsRequest(session_id="s1-copy"), timeout=T
    )
    code, details, info = await refused(e2e.delete_session("s1"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and '"a1"' in details
    assert info.reason == "SESSION_IN_USE" and info.metadata["agent_id"] == "a1"
    assert await event_count(e2e, "s1") > 0  # a refusal changes nothing
    with caplog.at_level(logging.INFO, logger="agentloop.access"):
        deleted = await e2e.delete_session("s1", dispose_agent=True, request_id="del-1")
    assert deleted.disposed_agent_id == "a1" and deleted.deleted_events > 0
    records = [r for r in caplog.records if r.name == "agentloop.access"]
    assert any(getattr(r, "session", "") == "s1" for r in records)  # the delete, by session
    assert any(getattr(r, "method", "").endswith("DeleteSession") for r in records)
    code, _, info = await refused(e2e.agents.GetSession(api.GetSessionRequest(session_id="s1")))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _, info = await refused(e2e.wait_idle("a1"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "AGENT_DISPOSED"
    # A retry with the request id gets the first answer; without one, NOT_FOUND.
    again = await e2e.delete_session("s1", dispose_agent=True, request_id="del-1")
    assert again == deleted
    code, _, _ = await refused(e2e.delete_session("s1"))
    assert code == grpc.StatusCode.NOT_FOUND
    # The fork stays whole; the other agent's calls go on.
    after = await e2e.agents.ListSessionEvents(
        api.ListSessionEventsRequest(session_id="s1-copy"), timeout=T
    )
    assert after.events == fork_events.events and fork.event_count == len(after.events)
    await e2e.send("bystander", "still here")
    assert (await e2e.wait_idle("bystander")).idle
    # The id is free: a new agent starts it afresh.
    await one_turn(e2e, "a2", "s1")
    assert (await e2e.agents.GetSession(api.GetSessionRequest(session_id="s1"))).session


async def test_an_idle_stored_session_is_deleted_and_bad_input_is_named(durable: E2E) -> None:
    e2e = durable
    await one_turn(e2e, "a1", "s1")
    await e2e.dispose("a1")
    deleted = await e2e.delete_session("s1")
    assert deleted.disposed_agent_id == "" and deleted.deleted_events > 0
    assert "s1" not in [s.session_id for s in await e2e.list_sessions()]
    code, details, info = await refused(e2e.delete_session(""))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("session_id:")
    code, details, _ = await refused(e2e.delete_session("a b"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("session_id:")
    code, details, _ = await refused(e2e.delete_session("nope", request_id="x" * 200))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("request_id:")
    code, _, info = await refused(e2e.delete_session("nope"))
    assert code == grpc.StatusCode.NOT_FOUND and info.reason == "SESSION_NOT_FOUND"


async def test_the_cli_deletes_a_session(durable: E2E) -> None:
    e2e = durable
    await one_turn(e2e, "a1", "s1")
    refused_ = await run_cli(e2e.target, "sessions", "delete", "s1")
    assert refused_.code == 2 and "FAILED_PRECONDITION" in refused_.stderr
    result = await run_cli(e2e.target, "sessions", "delete", "s1", "--dispose")
    assert result.code == 0, result.stderr
    assert result.stdout.startswith("deleted s1 (") and "disposed agent a1" in result.stdout
    listed = await run_cli(e2e.target, "sessions")
    assert listed.code == 0 and "s1" not in listed.stdout.split()
    usage = await run_cli(e2e.target, "sessions", "delete")
    assert usage.code == 2 and "needs a SESSION_ID" in usage.stderr
