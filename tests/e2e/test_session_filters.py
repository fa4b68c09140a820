"""ListSessions' filters through a real server on a real SQLite file: by agent, live or
stored, creation time, how the last turn ended, text in the id; bounded pages; and a
precise refusal of each bad filter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from google.protobuf import timestamp_pb2

from agentloop import InvalidArgument, connect_sync
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_pb2
from server.settings.config import Config
from tests.e2e.conftest import E2E, running_app
from tests.e2e.subagents import T, create, refused, says, scripted, send, until, wait_idle

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one server, one event loop


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def durable(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[E2E]:
    """One server on a SQLite store for the module, holding the sessions below."""
    data = Path(tmp_path_factory.mktemp("filters"))
    config = Config(listen="127.0.0.1:0", data_dir=str(data), agents=())
    async with running_app(config) as running:
        await _populate(running)
        yield running


START: dict[str, int] = {}
"""When the second agent was created (nanoseconds): the creation-time filters' cut."""


async def _populate(e2e: E2E) -> None:
    # alpha: one completed turn, live. beta: one aborted turn, then disposed (stored).
    # gamma: live, no turn. a0..a9: live, no turn, listed before them all.
    await create(e2e, "alpha", scripted(says("done")))
    await send(e2e, "alpha")
    await wait_idle(e2e, "alpha")
    START["cut"] = time.time_ns()
    await create(e2e, "beta", scripted(says("a slow answer " * 20, delay_ms=50)))
    await send(e2e, "beta")

    async def streaming() -> bool:
        got = await e2e.agents.GetSession(api.GetSessionRequest(agent_id="beta"), timeout=T)
        return got.session.event_count > 5

    await until(streaming, "beta streams")
    await e2e.cancel("beta", "stop")
    await wait_idle(e2e, "beta")
    await e2e.dispose("beta")
    await create(e2e, "gamma")
    for i in range(10):
        await create(e2e, f"a{i}")


async def listed(e2e: E2E, **filters: object) -> list[api.ListSessionsResponse]:
    """Every page of a filtered listing."""
    pages, token = [], ""
    while True:
        request = api.ListSessionsRequest(page_token=token, **filters)  # type: ignore[arg-type]
        page = await e2e.agents.ListSessions(request, timeout=T)
        pages.append(page)
        if not (token := page.next_page_token):
            return pages


async def agents_of(e2e: E2E, **filters: object) -> list[str]:
    """The agent each listed session's id names (`<agent>-session-<uuid>`)."""
    pages = await listed(e2e, **filters)
    return [s.session_id.split("-session-")[0] for p in pages for s in p.sessions]


async def test_each_filter_keeps_what_it_says(durable: E2E) -> None:
    everyone = await agents_of(durable)
    assert everyone == [*(f"a{i}" for i in range(10)), "alpha", "beta", "gamma"]
    assert await agents_of(durable, agent_id="alpha") == ["alpha"]
    assert await agents_of(durable, agent_id="beta") == ["beta"]  # disposed: its last driver
    assert await agents_of(durable, live=False) == ["beta"]
    assert "beta" not in await agents_of(durable, live=True)
    assert await agents_of(durable, end_reason="completed") == ["alpha"]
    assert await agents_of(durable, end_reason="aborted") == ["beta"]
    assert "alpha" not in await agents_of(durable, end_reason="none")
    assert await agents_of(durable, id_contains="BETA-sess") == ["beta"]
    cut = timestamp_pb2.Timestamp()
    cut.FromNanoseconds(START["cut"])
    assert "alpha" not in await agents_of(durable, created_after=cut)
    assert await agents_of(durable, created_before=cut) == ["alpha"]
    assert await agents_of(durable, agent_id="gamma", end_reason="completed") == []


def _agents(sessions: list[session_pb2.Session]) -> list[str]:
    return [s.session_id.split("-session-")[0] for s in sessions]


async def test_the_sdk_list_sessions_takes_each_filter(durable: E2E) -> None:
    cut = datetime.fromtimestamp(START["cut"] / 1e9, tz=UTC)
    assert _agents(await durable.list_sessions(agent_id="alpha")) == ["alpha"]
    assert _agents(await durable.list_sessions(live=False)) == ["beta"]
    assert "beta" not in _agents(await durable.list_sessions(live=True))
    assert _agents(await durable.list_sessions(end_reason="aborted")) == ["beta"]
    assert _agents(await durable.list_sessions(id_contains="GAMMA-sess")) == ["gamma"]
    assert _agents(await durable.list_sessions(created_before=cut)) == ["alpha"]
    assert "alpha" not in _agents(await durable.list_sessions(created_after=cut))
    assert len(await durable.list_sessions()) == 13
    with pytest.raises(InvalidArgument) as refusal:
        await durable.list_sessions(end_reason="finished")
    assert refusal.value.field == "end_reason"


async def test_the_sync_sdk_list_sessions_takes_the_same_filters(durable: E2E) -> None:
    cut = datetime.fromtimestamp(START["cut"] / 1e9, tz=UTC)

    def listing() -> tuple[list[str], list[str], list[str]]:
        with connect_sync(durable.target, timeout=T) as client:
            return (
                _agents(client.list_sessions(live=False, end_reason="aborted")),
                _agents(client.list_sessions(created_before=cut, agent_id="alpha")),
                _agents(client.list_sessions(created_after=cut, id_contains="A1-sess")),
            )

    assert await asyncio.to_thread(listing) == (["beta"], ["alpha"], ["a1"])


async def test_listed_sessions_say_how_their_last_turn_ended_and_when(durable: E2E) -> None:
    [page] = await listed(durable, agent_id="alpha")
    [alpha] = page.sessions
    assert alpha.last_end_reason == "completed" and alpha.agent_id == "alpha"
    assert alpha.update_time.ToNanoseconds() < START["cut"]
    [page] = await listed(durable, agent_id="beta")
    [beta] = page.sessions
    assert (beta.last_end_reason, beta.agent_id) == ("aborted", "")
    assert beta.update_time.ToNanoseconds() > START["cut"]
    [page] = await listed(durable, agent_id="gamma")
    assert page.sessions[0].last_end_reason == ""


async def test_a_filtered_page_examines_a_bounded_number_of_sessions(durable: E2E) -> None:
    # Ten sessions sort before beta's: a page of one examines ten, finds none, goes on.
    pages = await listed(durable, end_reason="aborted", page_size=1)
    assert [len(p.sessions) for p in pages][0] == 0 and pages[0].next_page_token
    found = [s.session_id for p in pages for s in p.sessions]
    assert len(found) == 1 and found[0].startswith("beta-session-")


async def test_a_page_token_is_bound_to_its_filters(durable: E2E) -> None:
    first = await durable.agents.ListSessions(
        api.ListSessionsRequest(page_size=1, live=True), timeout=T
    )
    assert first.next_page_token
    code, info, field = await refused(
        durable.agents.ListSessions(
            api.ListSessionsRequest(page_token=first.next_page_token, live=False), timeout=T
        )
    )
    assert (code, field) == (grpc.StatusCode.INVALID_ARGUMENT, "page_token")


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (api.ListSessionsRequest(end_reason="finished"), "end_reason"),
        (api.ListSessionsRequest(agent_id="not an id!"), "agent_id"),
        (api.ListSessionsRequest(id_contains="x" * 129), "id_contains"),
        (
            api.ListSessionsRequest(
                created_after=timestamp_pb2.Timestamp(seconds=20),
                created_before=timestamp_pb2.Timestamp(seconds=10),
            ),
            "created_before",
        ),
        (
            api.ListSessionsRequest(created_after=timestamp_pb2.Timestamp(seconds=-5)),
            "created_after",
        ),
        (
            api.ListSessionsRequest(created_before=timestamp_pb2.Timestamp(seconds=10**12)),
            "created_before",
        ),
        (
            api.ListSessionsRequest(created_after=timestamp_pb2.Timestamp(nanos=-1)),
            "created_after",
        ),
    ],
)
async def test_a_bad_filter_is_refused_naming_its_field(
    durable: E2E, request_: api.ListSessionsRequest, field: str
) -> None:
    code, info, named = await refused(durable.agents.ListSessions(request_, timeout=T))
    assert (code, info.reason, named) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", field)
    # The server is unharmed: the same listing without the bad filter answers.
    assert (await durable.agents.ListSessions(api.ListSessionsRequest(), timeout=T)).sessions
