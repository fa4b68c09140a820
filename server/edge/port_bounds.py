"""What one client may hold of a listener: connections, and the time to send a request.

The HTTP side (aiohttp) bounds the idle keep-alive itself (`keepalive_timeout`) but has
no timeout for a request's headers and no connection cap, so `GuardedConnection` sits
between the listening socket and aiohttp's protocol: it refuses a connection over the
caps with an answer (503, or 429 for one client address over its share) and closes a
connection whose request headers do not arrive in time (slowloris). The body's deadline
is the API handler's (`HttpSide._api`). The gRPC port gets the same bounds from gRPC's
own server arguments (`server/edge/grpc_bounds.py`).
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp import web

from server.edge.http_answers import ANSWER_HEADERS, AnsweringHandler
from server.kernel.limits import Limits


def channels_for(limits: Limits) -> int:
    """Channels the HTTP side needs to the gRPC server so that no call waits for a stream.

    Each HTTP connection has at most one call in flight, and each channel (one connection)
    carries at most `grpcMaxConcurrentStreams` of them.
    """
    return math.ceil(limits.http_max_connections / limits.grpc_max_concurrent_streams)


async def guarded_listener(
    runner: web.AppRunner, limits: Limits, host: str, port: int, tls: ssl.SSLContext | None
) -> tuple[asyncio.Server, ConnectionGuard]:
    """Listen on `host:port` for `runner`'s application, behind a `ConnectionGuard`.

    Not a `TCPSite`: the listener's protocol is the guard, in front of aiohttp's (whose
    own error answers carry the security headers: `AnsweringHandler`).
    """
    server = runner.server
    assert server is not None  # set up
    loop = asyncio.get_running_loop()

    def protocol() -> asyncio.Protocol:
        return AnsweringHandler(
            server,
            loop=loop,
            keepalive_timeout=limits.http_idle_timeout_seconds,
            lingering_time=limits.http_body_timeout_seconds,
            access_log=None,  # type: ignore[arg-type]  # off, as AppRunner(access_log=None)
        )

    guard = ConnectionGuard(limits, protocol)
    # With TLS the guard sees a connection once its handshake is done: the handshake has
    # the headers' deadline of its own.
    handshake = limits.http_header_timeout_seconds if tls is not None else None
    listener = await loop.create_server(
        guard, host, port, ssl=tls, reuse_address=True, ssl_handshake_timeout=handshake
    )
    return listener, guard


def refusal(http_status: int, reason: str, code: grpc.StatusCode, message: str) -> bytes:
    """A complete HTTP/1.1 answer (a `google.rpc.Status` body) that closes the connection."""
    body = json.dumps(
        {"status": code.name, "code": code.value[0], "message": message, "details": []}
    ).encode()
    head = [
        f"HTTP/1.1 {http_status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        "Retry-After: 1",
        "Cache-Control: no-store",
        *(f"{name}: {value}" for name, value in ANSWER_HEADERS.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class ConnectionGuard:
    """The open connections of one HTTP listener, counted in total and per client address."""

    def __init__(self, limits: Limits, inner: Callable[[], asyncio.Protocol]) -> None:
        self.limits = limits
        self._inner = inner
        self.total = 0
        self.by_client: Counter[str] = Counter()
        self.refused = 0
        self.timed_out = 0
        self._waiting: dict[asyncio.Transport, asyncio.TimerHandle] = {}
        """Connections waiting for a request's headers, and when they are cut."""

    def __call__(self) -> GuardedConnection:
        """The protocol factory of the listener."""
        return GuardedConnection(self, self._inner())

    def admit(self, transport: asyncio.Transport, client: str) -> bytes:
        """Count a new connection; the refusal to send instead when it is over a cap."""
        limits = self.limits
        if self.total >= limits.http_max_connections:
            self.refused += 1
            return refusal(
                503, "Service Unavailable", grpc.StatusCode.UNAVAILABLE,
                f"the server has {self.total} open connections:"
                f" {limits.describe('http_max_connections')}; retry later",
            )  # fmt: skip
        if self.by_client[client] >= limits.http_max_connections_per_client:
            self.refused += 1
            return refusal(
                429, "Too Many Requests", grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this address has {self.by_client[client]} open connections:"
                f" {limits.describe('http_max_connections_per_client')}",
            )  # fmt: skip
        self.total += 1
        self.by_client[client] += 1
        self.await_headers(transport, limits.http_header_timeout_seconds)
        return b""

    def release(self, transport: asyncio.Transport, client: str) -> None:
        """A counted connection closed."""
        self.headers_arrived(transport)
        self.total -= 1
        self.by_client[client] -= 1
        if not self.by_client[client]:
            del self.by_client[client]

    def await_headers(self, transport: asyncio.Transport, seconds: float) -> None:
        """Cut the connection unless a request's headers are complete within `seconds`."""
        self.headers_arrived(transport)
        loop = asyncio.get_running_loop()
        self._waiting[transport] = loop.call_later(seconds, self._cut, transport)

    def headers_arrived(self, transport: asyncio.Transport | None) -> None:
        """A request's headers are complete: no deadline until it is answered."""
        if transport is not None and (timer := self._waiting.pop(transport, None)):
            timer.cancel()

    def answered(self, transport: asyncio.Transport | None) -> None:
        """A request was answered: the next one's headers are due after the idle time."""
        if transport is not None and not transport.is_closing():
            limits = self.limits
            seconds = limits.http_idle_timeout_seconds + limits.http_header_timeout_seconds
            self.await_headers(transport, seconds)

    def _cut(self, transport: asyncio.Transport) -> None:
        self._waiting.pop(transport, None)
        self.timed_out += 1
        transport.abort()  # a slow client gets nothing more; its socket is freed now


class GuardedConnection(asyncio.Protocol):
    """One accepted connection: admitted under the caps, then handed to aiohttp's protocol."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._client = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection (or answer the refusal and close it)."""
        assert isinstance(transport, asyncio.Transport)
        peer: Any = transport.get_extra_info("peername")
        self._client = str(peer[0]) if isinstance(peer, tuple) else ""
        refused = self._guard.admit(transport, self._client)
        if refused:
            transport.write(refused)
            transport.close()
            return
        self._transport = transport
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        """Uncount the connection; aiohttp's protocol sees it closed."""
        if self._transport is None:  # refused: never counted, never handed on
            return
        self._guard.release(self._transport, self._client)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """To aiohttp's protocol."""
        if self._transport is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        """To aiohttp's protocol."""
        return self._inner.eof_received() if self._transport is not None else None

    def pause_writing(self) -> None:
        """To aiohttp's protocol (flow control)."""
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        """To aiohttp's protocol (flow control)."""
        self._inner.resume_writing()
