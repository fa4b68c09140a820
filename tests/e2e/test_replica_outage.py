"""A PostgreSQL restart under a real replica: clients see OK or `UNAVAILABLE`, nothing else.

A real `python -m server` over the real embedded PostgreSQL, with a client calling it
all along (reads, sends with request ids retried with the same id, a stream by
session id) while the database is stopped for two seconds and started again. Every
refusal is `UNAVAILABLE` with a reason and a `RetryInfo` and no driver text; the
stream ends `UNAVAILABLE`; readiness says "not ready" meanwhile and "ready" after;
the server reconnects by itself, and every accepted message is in the log once.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from server.plugins.required import READINESS_SERVICE
from tests.e2e.test_durability import Server, T, running_server, word_count_options
from tests.e2e.test_replicas import LEASE, read_log, request_ids, wait_idle
from tests.invariants import check_log
from tests.postgres import fresh_database, restart

CALL_TIMEOUT = 3.0


def refusal(error: grpc.aio.AioRpcError) -> tuple[str, float]:
    """The `ErrorInfo.reason` and the `RetryInfo` delay (seconds; 0 when absent) of a status."""
    reason, retry = "", 0.0
    for key, value in error.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for packed in status.details:
            if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                packed.Unpack(info)
                reason = info.reason
            elif packed.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                delay = error_details_pb2.RetryInfo()
                packed.Unpack(delay)
                retry = delay.retry_delay.ToNanoseconds() / 1e9
    return reason, retry


class Calls:
    """What a client saw: each status code, and each refusal's details."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.refusals: list[tuple[str, str, str, float]] = []
        self.accepted: list[str] = []
        """The request ids of the sends that were accepted."""

    async def call(self, name: str, call: Any) -> bool:
        """Make one call; whether it succeeded."""
        try:
            await call
        except grpc.aio.AioRpcError as error:
            code = error.code().name
            self.codes[code] = self.codes.get(code, 0) + 1
            self.refusals.append((name, error.details() or "", *refusal(error)))
            return False
        self.codes["OK"] = self.codes.get("OK", 0) + 1
        return True


async def keep_calling(server: Server, agent_id: str, session_id: str, calls: Calls) -> None:
    """Reads and sends until cancelled."""
    n = 0
    while True:
        await calls.call("GetAgent", server.factory.GetAgent(
            fac.GetAgentRequest(agent_id=agent_id), timeout=CALL_TIMEOUT))  # fmt: skip
        await calls.call("GetSession", server.agents.GetSession(
            api.GetSessionRequest(session_id=session_id), timeout=CALL_TIMEOUT))  # fmt: skip
        await calls.call("ListSessionEvents", server.agents.ListSessionEvents(
            api.ListSessionEventsRequest(session_id=session_id, page_size=100),
            timeout=CALL_TIMEOUT))  # fmt: skip
        request_id = f"m{n}"
        send = api.SendMessageRequest(agent_id=agent_id, text="count words", request_id=request_id)
        for _ in range(100):  # retried with the same request id until accepted
            if await calls.call("SendMessage", server.agents.SendMessage(
                    send, timeout=CALL_TIMEOUT)):  # fmt: skip
                break
            await asyncio.sleep(0.2)
        else:
            continue  # never accepted: not counted
        calls.accepted.append(request_id)
        n += 1
        await asyncio.sleep(0.05)


async def follow(server: Server, session_id: str) -> str:
    """Stream the session's events until the stream ends; how it ended."""
    stream = server.agents.StreamSessionEvents(
        api.StreamSessionEventsRequest(session_id=session_id)
    )
    try:
        async for _ in stream:
            pass
    except grpc.aio.AioRpcError as error:
        return error.code().name
    return "OK"


async def readiness(server: Server) -> int:
    with contextlib.suppress(grpc.aio.AioRpcError):
        return await server.health(READINESS_SERVICE)
    return -1


async def test_a_postgres_restart_gives_clients_only_ok_or_unavailable(
    tmp_path: Path, postgres_server: str, postgres_instance: Any
) -> None:
    dsn = await fresh_database(postgres_server)
    config = (
        f"agents: []\nstore: postgres\npostgresDsn: '{dsn}'\nreplicaId: r0\nleaseSeconds: {LEASE}\n"
    )
    async with running_server(tmp_path, config) as r0:
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="a", options=word_count_options()), timeout=T
        )
        session_id = created.agent.session_id
        assert await readiness(r0) == health_pb2.HealthCheckResponse.SERVING
        calls = Calls()
        load = asyncio.create_task(keep_calling(r0, "a", session_id, calls))
        stream = asyncio.create_task(follow(r0, session_id))
        await asyncio.sleep(1.0)
        seen: set[int] = set()

        async def watch_readiness() -> None:
            while True:
                seen.add(await readiness(r0))
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch_readiness())
        await restart(postgres_instance, down_seconds=2.0)
        for _ in range(100):  # reconnected by itself, with backoff
            if await readiness(r0) == health_pb2.HealthCheckResponse.SERVING:
                break
            await asyncio.sleep(0.1)
        assert await readiness(r0) == health_pb2.HealthCheckResponse.SERVING
        before = calls.codes.get("OK", 0)
        for _ in range(50):  # calls succeed again
            if calls.codes.get("OK", 0) > before + 3:
                break
            await asyncio.sleep(0.1)
        watcher.cancel()
        load.cancel()
        await asyncio.gather(load, watcher, return_exceptions=True)
        assert calls.codes.get("OK", 0) > before + 3, calls.codes  # the server serves again
        assert health_pb2.HealthCheckResponse.NOT_SERVING in seen, seen
        ended = await asyncio.wait_for(stream, 10) if stream.done() else "open"
        if not stream.done():
            stream.cancel()

        assert set(calls.codes) <= {"OK", "UNAVAILABLE"}, (calls.codes, calls.refusals[:5])
        assert calls.codes.get("UNAVAILABLE", 0) > 0, calls.codes  # the outage was seen
        for code, message, reason, retry in calls.refusals:
            assert reason in {"STORE_UNAVAILABLE", "AGENT_MOVING"}, (code, message, reason)
            assert retry > 0, (code, message, reason)
            for internal in ("asyncpg", "Error", "Unexpected", "Connection"):
                assert internal not in message, message
        assert ended in {"UNAVAILABLE", "open"}, ended

        await wait_idle(r0, "a")
        stored = await read_log(r0, session_id)
        check_log(stored)
        ids = request_ids(stored)
        assert len(ids) == len(set(ids))  # nothing twice
        assert set(calls.accepted) <= set(ids)  # nothing accepted was lost
        await r0.terminate()
        assert "Traceback" not in r0.log(), r0.log()
