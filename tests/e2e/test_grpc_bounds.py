"""The gRPC port as a public endpoint: a connection cap, idle and aged connections sent
GOAWAY, keepalive pings enforced and calls per connection bounded, tried against a real
server with raw sockets and real channels while a health check and a turn are served."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import agent_service_pb2_grpc
from server.kernel.limits import Limits
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, read_turn, running_app

pytestmark = pytest.mark.usefixtures("without_tokens")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
"""The HTTP/2 client preface and an empty SETTINGS frame: a client that then says nothing."""
GOAWAY = 0x7
SLACK = 5.0
"""How long after its deadline a bound may act on a loaded machine (a bound, not a speed)."""


@contextlib.asynccontextmanager
async def bounded(**limits: float) -> AsyncIterator[E2E]:
    config = Config(listen="127.0.0.1:0", store="memory", agents=(), limits=Limits(**limits))  # type: ignore[arg-type]
    async with running_app(config) as e2e:
        await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="a"), timeout=READ_TIMEOUT)
        yield e2e


@contextlib.contextmanager
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def raw_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(PREFACE)
    sock.setblocking(False)
    return sock


async def frames_until_closed(sock: socket.socket, within: float) -> list[int]:
    """The types of the HTTP/2 frames the server sends until it closes `sock`."""
    loop = asyncio.get_running_loop()
    received = b""
    async with asyncio.timeout(within):
        while True:
            try:
                chunk = await loop.sock_recv(sock, 65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            received += chunk
    kinds = []
    while len(received) >= 9:
        length = int.from_bytes(received[:3], "big")
        kinds.append(received[3])
        received = received[9 + length :]
    return kinds


def still_open(sock: socket.socket) -> bool:
    try:
        while sock.recv(65536):
            pass  # frames the server sent (its SETTINGS): still open
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    return False


async def a_turn(e2e: E2E, from_seq: int = 1) -> int:
    """A health check and a whole turn are served; the seq after the turn's end."""
    assert await e2e.health() == health_pb2.HealthCheckResponse.SERVING
    await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id="a", text="still there?"), timeout=READ_TIMEOUT
    )
    events = await read_turn(e2e.agents, "a", from_seq)
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    return events[-1].seq + 1


async def test_a_connection_flood_is_stopped_at_the_cap() -> None:
    async with bounded(grpc_max_connections=10) as e2e:
        after = await a_turn(e2e)  # the test's own channel is connected: 1 of 10
        with sockets() as flood:
            for _ in range(30):
                flood.append(raw_client(e2e.port))
            await asyncio.sleep(1.0)  # time for the server to accept and close
            open_ones = [sock for sock in flood if still_open(sock)]
            assert len(open_ones) == 9
            after = await a_turn(e2e, after)  # the connected client is unharmed
            async with grpc.aio.insecure_channel(e2e.target) as extra:  # at the cap: none
                stub: Any = health_pb2_grpc.HealthStub(extra)  # the typeshed stub has no methods
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                assert refused.value.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
        async with grpc.aio.insecure_channel(e2e.target) as fresh:  # the flood gone
            checker: Any = health_pb2_grpc.HealthStub(fresh)
            answer = await checker.Check(
                health_pb2.HealthCheckRequest(), timeout=READ_TIMEOUT, wait_for_ready=True
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        await a_turn(e2e, after)


async def test_an_idle_connection_is_sent_goaway() -> None:
    async with bounded(grpc_max_connection_idle_seconds=1.0) as e2e:
        with sockets() as opened:
            opened.append(raw_client(e2e.port))
            started = time.monotonic()
            kinds = await frames_until_closed(opened[0], 1.0 + SLACK)
            assert time.monotonic() - started >= 0.8  # gRPC's timers are not to the ms
        assert GOAWAY in kinds
        await a_turn(e2e)  # the test's channel reconnects after its own GOAWAY


async def test_a_call_past_the_age_and_its_grace_is_ended() -> None:
    limits = {"grpc_max_connection_age_seconds": 1.0, "grpc_max_connection_age_grace_seconds": 1.0}
    async with bounded(**limits) as e2e:
        async with grpc.aio.insecure_channel(e2e.target) as channel:
            stub = agent_service_pb2_grpc.AgentServiceStub(channel)
            started = time.monotonic()
            call = stub.StreamSessionEvents(
                api.StreamSessionEventsRequest(agent_id="a", from_seq=1)
            )
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async with asyncio.timeout(2.0 + SLACK):
                    async for _ in call:
                        pass
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started >= 1.0
        await a_turn(e2e)


PINGING = (
    ("grpc.keepalive_time_ms", 100),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
"""A client that pings every 100 ms, with or without data."""


async def test_pings_faster_than_allowed_close_the_connection() -> None:
    async with bounded(grpc_keepalive_min_interval_seconds=60.0) as e2e:
        async with grpc.aio.insecure_channel(e2e.target, options=PINGING) as channel:
            stub = agent_service_pb2_grpc.AgentServiceStub(channel)
            call = stub.StreamSessionEvents(
                api.StreamSessionEventsRequest(agent_id="a", from_seq=1)
            )
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async with asyncio.timeout(SLACK):
                    async for _ in call:
                        pass
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        await a_turn(e2e)  # a well-behaved client is served


async def test_pings_as_often_as_allowed_keep_the_connection() -> None:
    async with (
        bounded(grpc_keepalive_min_interval_seconds=0.05) as e2e,
        grpc.aio.insecure_channel(e2e.target, options=PINGING) as channel,
    ):
        stub = agent_service_pb2_grpc.AgentServiceStub(channel)
        call = stub.StreamSessionEvents(api.StreamSessionEventsRequest(agent_id="a", from_seq=1))
        await call.read()
        reading = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait({reading}, timeout=2.0)  # 20 pings, no strike
        assert not done
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading


async def test_calls_beyond_the_streams_of_a_connection_wait_for_one() -> None:
    async with (
        bounded(grpc_max_concurrent_streams=2) as e2e,
        grpc.aio.insecure_channel(e2e.target) as channel,
    ):
        stub = agent_service_pb2_grpc.AgentServiceStub(channel)
        request = api.StreamSessionEventsRequest(agent_id="a", from_seq=1)
        streams = [stub.StreamSessionEvents(request) for _ in range(2)]
        for stream in streams:
            await stream.read()  # both hold a stream now
        third = asyncio.ensure_future(stub.GetSession(api.GetSessionRequest(agent_id="a")))
        done, _ = await asyncio.wait({third}, timeout=1.0)
        assert not done  # the connection has no stream free
        await a_turn(e2e)  # another connection is served meanwhile
        streams[0].cancel()
        async with asyncio.timeout(READ_TIMEOUT):
            await third  # a stream freed: the waiting call goes through
        streams[1].cancel()
