"""The HTTP side as a public endpoint: the headers of every answer, a status for every
`/api/` path, and the bounds on slow and many clients, tried with raw sockets against a
real server while a health check, a page and a turn go on being served."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from agentloop.v1 import agent_factory_service_pb2 as fac
from server.edge.api_http import STATIC_DIR
from server.edge.http_answers import ANSWER_HEADERS
from server.kernel.limits import Limits
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, read_turn
from tests.e2e.registry import eventually
from tests.e2e.test_http_api import FACTORY, JSON, http_app
from tests.e2e.test_server_tls import Pki, pki, tls_config

__all__ = ["pki"]  # the fixture, used by name

pytestmark = pytest.mark.usefixtures("without_tokens")

SLACK = 5.0
"""How long after its deadline a cut may come on a loaded machine (a bound, not a speed)."""


def config(**limits: float) -> Config:
    """A server without a token, with these limits."""
    return Config(listen="127.0.0.1:0", store="memory", agents=(), limits=Limits(**limits))  # type: ignore[arg-type]


def assert_answer_headers(response: httpx.Response) -> None:
    where = f"{response.request.method} {response.request.url.path} ({response.status_code})"
    for name, value in ANSWER_HEADERS.items():
        assert response.headers.get(name) == value, f"{where}: {name}"
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    if response.status_code >= 400 or response.request.url.path.startswith("/api"):
        assert response.headers.get("Cache-Control") == "no-store", where


async def test_every_path_the_server_serves_carries_the_security_headers() -> None:
    files = sorted(p.name for p in STATIC_DIR.iterdir() if p.is_file())
    assert {"index.html", "app.js", "console.css"} <= set(files)
    async with http_app(config()) as (_, client):
        walked = 0
        for path in ["/", *(f"/console/{name}" for name in files)]:
            response = await client.get(path)
            assert response.status_code == 200, path
            assert_answer_headers(response)
            walked += 1
        if_modified = await client.get("/console/app.js", headers={"If-None-Match": "*"})
        assert if_modified.status_code in (200, 304)
        assert_answer_headers(if_modified)
        for path in ["/console/", "/console/nope.js", "/nope", "/console/%2e%2e/pyproject.toml"]:
            response = await client.get(path)
            assert response.status_code in (403, 404), path
            assert_answer_headers(response)
            walked += 1
        ok = await client.post(f"{FACTORY}/ListAgents", headers=JSON, content=b"{}")
        assert ok.status_code == 200
        assert_answer_headers(ok)
        assert walked == len(files) + 5


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
    ],
    ids=["bad-request-line", "long-url", "long-header"],
)
async def test_a_request_the_server_cannot_parse_is_answered_with_the_headers(raw: bytes) -> None:
    async with http_app(config()) as (e2e, _):
        assert e2e.app.http is not None
        with sockets() as opened:
            sock = connect(e2e.app.http.port)
            opened.append(sock)
            await asyncio.get_running_loop().sock_sendall(sock, raw)
            answer = await closed_by_server(sock, READ_TIMEOUT)
    head = answer.partition(b"\r\n\r\n")[0].decode()
    assert head.startswith("HTTP/1.0 400 ") or head.startswith("HTTP/1.1 400 "), head
    for name, value in {**ANSWER_HEADERS, "Cache-Control": "no-store"}.items():
        assert f"{name}: {value}" in head.split("\r\n"), f"{name} is missing: {head}"


async def test_an_api_refusal_under_a_token_is_not_cached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTLOOP_TOKEN", "bounds-token")
    async with http_app(config()) as (_, client):
        response = await client.post(f"{FACTORY}/ListAgents", headers=JSON, content=b"{}")
        assert response.status_code == 401
        assert response.json()["status"] == "UNAUTHENTICATED"
        assert_answer_headers(response)


@pytest.mark.parametrize(
    ("path", "http_status", "status"),
    [
        ("/api", 404, "NOT_FOUND"),
        ("/api/", 404, "NOT_FOUND"),
        ("/api/x", 404, "NOT_FOUND"),
        ("/api/agentloop.v1.AgentService/SendMessage/extra", 404, "NOT_FOUND"),
        ("/api/" + "x" * 4000, 404, "NOT_FOUND"),
        ("/api/agentloop.v1.AgentService/Nope", 501, "UNIMPLEMENTED"),
    ],
    ids=["api", "api-slash", "one-segment", "extra-segment", "long", "unknown-method"],
)
async def test_every_api_path_answers_a_status(path: str, http_status: int, status: str) -> None:
    async with http_app(config()) as (_, client):
        for method in ("GET", "POST"):
            response = await client.request(method, path, headers=JSON, content=b"{}")
            assert response.status_code == http_status, (method, path)
            assert response.headers["Content-Type"].startswith("application/json")
            body = response.json()
            assert body["status"] == status
            assert isinstance(body["code"], int) and body["code"] > 0
            assert body["message"] and "details" in body
            assert_answer_headers(response)


async def test_a_get_on_a_method_is_a_status_too() -> None:
    async with http_app(config()) as (_, client):
        response = await client.get(f"{FACTORY}/ListAgents")
        assert response.status_code == 405
        assert response.headers["Allow"] == "POST"
        assert response.json()["status"] == "METHOD_NOT_ALLOWED"
        assert_answer_headers(response)


@contextlib.contextmanager
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    sock.setblocking(False)
    return sock


async def closed_by_server(sock: socket.socket, within: float) -> bytes:
    """Everything the server sent until it closed `sock`; fails if it stays open `within`."""
    loop = asyncio.get_running_loop()
    received = b""
    async with asyncio.timeout(within):
        while True:
            try:
                chunk = await loop.sock_recv(sock, 65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk


async def serves_a_turn(
    e2e: E2E, client: httpx.AsyncClient, agent_id: str, from_seq: int = 1
) -> int:
    """A page, a health check and a whole turn (sent over HTTP) are served; returns the
    seq after the turn's end."""
    assert (await client.get("/")).status_code == 200
    assert await e2e.health() == 1  # SERVING
    sent = await client.post(
        "/api/agentloop.v1.AgentService/SendMessage",
        headers=JSON,
        content=json.dumps({"agent_id": agent_id, "text": "still there?"}).encode(),
    )
    assert sent.status_code == 200, sent.text
    events = await read_turn(e2e.agents, agent_id, from_seq)
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    assert any(event.WhichOneof("payload") == "user_message" for event in events)
    return events[-1].seq + 1


@pytest.fixture
async def slow() -> AsyncIterator[tuple[E2E, httpx.AsyncClient]]:
    """A server whose HTTP side gives 1.5 s for headers and for a body."""
    limits = {"http_header_timeout_seconds": 1.5, "http_body_timeout_seconds": 1.5}
    async with http_app(config(**limits)) as pair:
        await pair[0].factory.CreateAgent(fac.CreateAgentRequest(agent_id="a"), timeout=10)
        yield pair


async def test_slow_headers_are_cut_at_the_timeout_while_the_rest_is_served(
    slow: tuple[E2E, httpx.AsyncClient],
) -> None:
    e2e, client = slow
    assert e2e.app.http is not None and e2e.app.http.guard is not None
    port = e2e.app.http.port
    with sockets() as slow_clients:
        started = time.monotonic()
        for _ in range(40):
            sock = connect(port)
            sock.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            slow_clients.append(sock)

        async def trickle() -> None:  # one header line every 0.2 s, never the end
            for n in range(100):
                await asyncio.sleep(0.2)
                for sock in slow_clients:
                    with contextlib.suppress(OSError):
                        sock.send(f"X-Slow-{n}: 1\r\n".encode())

        trickling = asyncio.ensure_future(trickle())
        try:
            after = await serves_a_turn(e2e, client, "a")
            cuts = await asyncio.gather(
                *(closed_by_server(sock, 1.5 + SLACK) for sock in slow_clients)
            )
        finally:
            trickling.cancel()
        elapsed = time.monotonic() - started
    assert all(cut == b"" for cut in cuts)  # cut, not answered
    assert elapsed >= 1.5
    assert e2e.app.http.guard.timed_out >= 40
    await serves_a_turn(e2e, client, "a", after)


async def test_a_slow_body_is_cut_at_the_timeout(slow: tuple[E2E, httpx.AsyncClient]) -> None:
    e2e, client = slow
    assert e2e.app.http is not None
    with sockets() as opened:
        sock = connect(e2e.app.http.port)
        opened.append(sock)
        sock.send(
            b"POST /api/agentloop.v1.AgentService/SendMessage HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        started = time.monotonic()

        async def trickle() -> None:  # one byte every 0.2 s
            for _ in range(100):
                await asyncio.sleep(0.2)
                with contextlib.suppress(OSError):
                    sock.send(b" ")

        trickling = asyncio.ensure_future(trickle())
        try:
            await serves_a_turn(e2e, client, "a")
            answer = await closed_by_server(sock, 1.5 + SLACK)
        finally:
            trickling.cancel()
        assert time.monotonic() - started >= 1.5
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), head
    assert b"cache-control: no-store" in head.lower()
    status = json.loads(body)
    assert status["status"] == "DEADLINE_EXCEEDED"
    assert "limits.httpBodyTimeoutSeconds (1.5)" in status["message"]


async def test_a_tls_handshake_never_finished_is_cut(pki: Pki, tmp_path: Path) -> None:
    tls = tls_config(pki, tmp_path, mutual=False)
    limits = Limits(http_header_timeout_seconds=1.0)
    async with http_app(replace(tls, limits=limits)) as (e2e, _):
        assert e2e.app.http is not None
        with sockets() as opened:
            sock = connect(e2e.app.http.port)  # TCP only: no ClientHello ever comes
            opened.append(sock)
            started = time.monotonic()
            assert await closed_by_server(sock, 1.0 + SLACK) == b""
            assert time.monotonic() - started >= 1.0


async def test_an_idle_keep_alive_connection_is_closed() -> None:
    async with http_app(config(http_idle_timeout_seconds=1.0)) as (e2e, _):
        assert e2e.app.http is not None
        with sockets() as opened:
            sock = connect(e2e.app.http.port)
            opened.append(sock)
            sock.send(b"GET /console/console.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            started = time.monotonic()
            answer = await closed_by_server(sock, 1.0 + SLACK)
            assert time.monotonic() - started >= 1.0
        assert answer.startswith(b"HTTP/1.1 200 ")


async def test_a_connection_flood_is_stopped_at_the_caps() -> None:
    limits = {"http_max_connections": 12, "http_max_connections_per_client": 6}
    async with http_app(config(**limits)) as (e2e, _):
        http = e2e.app.http
        assert http is not None and http.guard is not None
        guard = http.guard

        def counted(total: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return guard.total == total

            return check

        with sockets() as flood:

            async def admitted(source: str, count: int) -> None:
                for _ in range(count):
                    flood.append(connect(http.port, source))
                    await eventually(counted(len(flood) - guard.refused), "the count")

            async def refusal(source: str) -> bytes:
                sock = connect(http.port, source)
                flood.append(sock)
                return await closed_by_server(sock, READ_TIMEOUT)

            await admitted("127.0.0.2", 6)
            await admitted("127.0.0.3", 5)
            refused = {"127.0.0.2": await refusal("127.0.0.2")}  # over its share
            await admitted("127.0.0.3", 1)
            refused["127.0.0.4"] = await refusal("127.0.0.4")  # over the total
            assert guard.total == 12 and guard.refused == 2
        for source, http_status, status, limit in [
            ("127.0.0.2", b"429", "RESOURCE_EXHAUSTED", "httpMaxConnectionsPerClient (6)"),
            ("127.0.0.4", b"503", "UNAVAILABLE", "httpMaxConnections (12)"),
        ]:
            head, _, body = refused[source].partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 " + http_status), head
            assert b"X-Content-Type-Options: nosniff" in head
            assert json.loads(body)["status"] == status
            assert limit in json.loads(body)["message"]
        await eventually(counted(0), "the flood gone from the count")
        await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="b"), timeout=10)
        base = f"http://127.0.0.1:{http.port}"
        async with httpx.AsyncClient(base_url=base, timeout=READ_TIMEOUT) as client:
            await serves_a_turn(e2e, client, "b")


async def test_the_http_side_has_a_stream_for_each_of_its_connections() -> None:
    """3 channels of 2 streams for 6 connections: 5 open event streams and a call fit."""
    limits = {"grpc_max_concurrent_streams": 2, "http_max_connections": 6}
    async with http_app(config(**limits)) as (e2e, _), contextlib.AsyncExitStack() as stack:
        assert e2e.app.http is not None
        await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="a"), timeout=READ_TIMEOUT)
        base = f"http://127.0.0.1:{e2e.app.http.port}"
        body = json.dumps({"agent_id": "a", "from_seq": 1}).encode()
        streams: list[AsyncIterator[str]] = []
        for _ in range(5):  # each on its own connection, each holding a gRPC stream
            client = await stack.enter_async_context(
                httpx.AsyncClient(base_url=base, timeout=READ_TIMEOUT)
            )
            response = await stack.enter_async_context(
                client.stream(
                    "POST",
                    "/api/agentloop.v1.AgentService/StreamSessionEvents",
                    headers=JSON,
                    content=body,
                )
            )
            assert response.status_code == 200
            lines = response.aiter_lines()
            assert (await anext(lines)).startswith("event: message")
            streams.append(lines)  # held: a collected reader would close its stream
        assert e2e.app.http.in_flight == [2, 2, 1]
        async with httpx.AsyncClient(base_url=base, timeout=READ_TIMEOUT) as client:
            await serves_a_turn(e2e, client, "a")
