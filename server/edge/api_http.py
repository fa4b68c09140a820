"""The HTTP side of the server (`httpListen`): the web console and the API as JSON.

`POST /api/<package.Service>/<Method>` with a JSON body (the protobuf JSON mapping of
the request) answers the response as JSON; the streaming methods (`StreamSessionEvents`,
`StreamAgentEvents`) answer server-sent events, one `data:` line per stream response.
Nothing here implements a rule of the API: each call is forwarded to the server's own
gRPC services over a private Unix socket, with the caller's `Authorization` header as
metadata, so the interceptors (access log, token, request guard, replica forwarding)
and the servicers answer it exactly as they answer a gRPC client. A refusal is the gRPC
status as JSON (`google.rpc.Status`: code, message, details, plus `status`, the code's
name) under the matching HTTP code.

The token is read from the `Authorization` header only, never from the URL. Every
answer carries the security headers (`http_answers.py`); slow and greedy clients are
bounded by the limits' `http*` timeouts and caps (`port_bounds.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

# googleapis-common-protos ships .pyi files but no py.typed marker.
from google.rpc import status_pb2  # type: ignore[import-untyped]

from agentloop.plugin.v1 import plugin_registry_service_pb2
from agentloop.v1 import (
    agent_factory_service_pb2,
    agent_service_pb2,
    scripted_pb2,  # noqa: F401  (registers ScriptedOptions for `provider_options` as JSON)
)
from server.edge.api_access import CLIENT_KEY, RELAY_KEY
from server.edge.client_address import client_address, trusted_networks
from server.edge.http_answers import (
    answer_headers,
    api_errors,
    status_json,
    status_response,
)
from server.edge.port_bounds import ConnectionGuard, channels_for, guarded_listener
from server.edge.status import rich_status
from server.kernel.limits import Limits
from server.settings.addresses import is_loopback

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "console"
"""The console's files: plain HTML, CSS and ES modules, no build step."""

SERVICES: tuple[ServiceDescriptor, ...] = (
    agent_factory_service_pb2.DESCRIPTOR.services_by_name["AgentFactoryService"],
    agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"],
    plugin_registry_service_pb2.DESCRIPTOR.services_by_name["PluginRegistryService"],
)
"""The services the HTTP side forwards: every method of each, as the contract grows."""

FORWARDED_HEADERS = ("authorization", "traceparent", "tracestate")
"""Request headers passed on to the gRPC call as metadata."""

# Metadata of a forwarded call: the HTTP client's address, and this side's secret
# that makes the access log believe it (a gRPC client cannot know it).

UNDECODABLE = b"\xff"
"""Bytes no message decodes: sent for a body that is not valid JSON, so the server
answers (token first, then the malformed body) as it answers a bad gRPC body."""


@dataclass(frozen=True)
class Method:
    """One RPC the HTTP side forwards."""

    path: str
    """`/package.Service/Method`, as gRPC names it."""
    request: type[Message]
    response: type[Message]
    streaming: bool


def methods() -> dict[str, Method]:
    """Every forwarded method by its gRPC path."""
    found = {}
    for service in SERVICES:
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            found[path] = Method(
                path=path,
                request=message_factory.GetMessageClass(method.input_type),
                response=message_factory.GetMessageClass(method.output_type),
                streaming=method.server_streaming,
            )
    return found


def status_of_error(error: grpc.aio.AioRpcError) -> status_pb2.Status:
    """The `google.rpc.Status` of a failed call: the rich one from its trailer if any."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            return status_pb2.Status.FromString(value)
    return status_pb2.Status(code=error.code().value[0], message=error.details() or "")


def sse(kind: str, payload: dict[str, Any], event_id: str = "") -> bytes:
    """One server-sent event (the JSON on a single `data:` line)."""
    head = f"event: {kind}\n" + (f"id: {event_id}\n" if event_id else "")
    return f"{head}data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class HttpSide:
    """The aiohttp server of the console and the JSON API, and its channel to gRPC."""

    def __init__(
        self,
        listen: str,
        ssl_context: ssl.SSLContext | None,
        limits: Limits,
        local_hosts_only: bool = False,
        trusted_proxies: Sequence[str] = (),
    ) -> None:
        self.listen = listen
        self.trusted = trusted_networks(trusted_proxies)
        """Peers whose `X-Forwarded-For` names the client (`client_address`)."""
        self.relay_key = secrets.token_hex(16)
        self.local_hosts_only = local_hosts_only
        """Refuse requests naming another host than this machine (DNS rebinding)."""
        self.ssl_context = ssl_context
        self.limits = limits
        self.methods = methods()
        self._dir = ""
        self.port = 0
        self._channels: list[grpc.aio.Channel] = []
        self.in_flight: list[int] = []
        """Calls in flight on each channel: a call takes the least busy one."""
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.guard: ConnectionGuard | None = None
        # JSON is larger than the protobuf it encodes (base64, escapes): the exact limit
        # is the gRPC server's own, on the forwarded message; this only bounds memory.
        self._max_body = 4 * limits.max_request_bytes + 64 * 1024

    def grpc_address(self) -> str:
        """The private Unix socket (in a new 0700 directory) for the gRPC server to add."""
        if not self._dir:
            self._dir = tempfile.mkdtemp(prefix="agentloop-http-")  # this user only
        return f"unix:{os.path.join(self._dir, 'grpc.sock')}"

    async def start(self) -> int:
        """Connect to the gRPC server's socket and serve HTTP; returns the bound port."""
        # One connection carries `grpcMaxConcurrentStreams` calls: enough connections
        # (each its own subchannel) that every HTTP connection's call gets a stream.
        own = (("grpc.use_local_subchannel_pool", 1),)
        count = channels_for(self.limits)
        self._channels = [
            grpc.aio.insecure_channel(self.grpc_address(), options=own) for _ in range(count)
        ]
        self.in_flight = [0] * count
        app = web.Application(
            client_max_size=self._max_body,
            middlewares=[self._deadlines, api_errors, self._host_check],
        )
        app.on_response_prepare.append(answer_headers)
        app.router.add_get("/", self._index)
        app.router.add_static("/console/", STATIC_DIR, append_version=False)
        app.router.add_route("*", "/api/{service}/{method}", self._api)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        host, _, port = self.listen.rpartition(":")
        self._listener, self.guard = await guarded_listener(
            self._runner, self.limits, host.strip("[]"), int(port), self.ssl_context
        )
        self.port = int(self._listener.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Close the open streams and the server, then the channels and the socket."""
        if self._listener is not None:  # no new connections
            self._listener.close()
        for channel in self._channels:
            await channel.close()
        self._channels = []
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    @contextlib.contextmanager
    def _channel(self) -> Iterator[grpc.aio.Channel]:
        """The least busy channel to the gRPC server, for one call."""
        index = min(range(len(self._channels)), key=self.in_flight.__getitem__)
        self.in_flight[index] += 1
        try:
            yield self._channels[index]
        finally:
            self.in_flight[index] -= 1

    @web.middleware
    async def _deadlines(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """No header deadline while a request is handled; the next one's after it."""
        assert self.guard is not None
        self.guard.headers_arrived(request.transport)  # they are: the handler runs
        try:
            return await handler(request)
        finally:
            self.guard.answered(request.transport)

    @web.middleware
    async def _host_check(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Refuse a foreign Host on a loopback port without a token.

        A site that rebinds its own name to 127.0.0.1 is refused (DNS rebinding).
        """
        host = request.host
        if self.local_hosts_only and not (is_loopback(host) or is_loopback(f"{host}:80")):
            return status_response(
                rich_status(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"the Host {host!r} is not this machine: open the console as"
                    " http://127.0.0.1:<port>/ or http://localhost:<port>/",
                    "FOREIGN_HOST",
                )
            )
        return await handler(request)

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html")

    async def _api(self, request: web.Request) -> web.StreamResponse:
        path = f"/{request.match_info['service']}/{request.match_info['method']}"
        method = self.methods.get(path)
        if method is None:
            return status_response(
                rich_status(grpc.StatusCode.UNIMPLEMENTED, f"no method {path}", "UNKNOWN_METHOD")
            )
        if request.method != "POST":
            return web.json_response(
                {"status": "METHOD_NOT_ALLOWED", "message": f"{path}: use POST"},
                status=405,
                headers={"Allow": "POST"},
            )
        # A JSON content type keeps other sites' plain forms out (they cannot send one
        # without a CORS preflight, which this side never grants).
        if request.content_type != "application/json":
            return status_response(
                rich_status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "the body must be JSON: send 'Content-Type: application/json'",
                    "MALFORMED_REQUEST",
                )
            )
        try:
            async with asyncio.timeout(self.limits.http_body_timeout_seconds):
                body = await request.read()
        except TimeoutError:
            answer = status_response(
                rich_status(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "the request body did not arrive within"
                    f" {self.limits.describe('http_body_timeout_seconds')}",
                    "LIMIT_EXCEEDED",
                    {"limit": "http_body_timeout_seconds"},
                ),
                408,
            )
            answer.force_close()  # the rest of the body is not waited for
            return answer
        except web.HTTPRequestEntityTooLarge:
            return status_response(
                rich_status(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the request body is over {self._max_body} bytes",
                    "LIMIT_EXCEEDED",
                    {"limit": "max_request_bytes"},
                )
            )
        peer = request.transport.get_extra_info("peername") if request.transport else None
        host, port = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else ("", None)
        client = client_address(
            host, port, request.headers.get("X-Forwarded-For", ""), self.trusted
        )  # fmt: skip
        metadata = (
            *(
                (name, request.headers[name])
                for name in FORWARDED_HEADERS
                if name in request.headers
            ),
            (CLIENT_KEY, client),
            (RELAY_KEY, self.relay_key),
        )
        problem = ""
        payload: Message | bytes
        try:
            payload = json_format.Parse(body or b"{}", method.request())
        except (json_format.ParseError, UnicodeDecodeError, ValueError) as error:
            problem = str(error)[:300]
            payload = UNDECODABLE
        with self._channel() as channel:
            if method.streaming:
                return await self._stream(channel, request, method, payload, metadata, problem)
            return await self._unary(channel, method, payload, metadata, problem)

    def _serializer(self, payload: Message | bytes) -> Callable[[Any], bytes] | None:
        return None if isinstance(payload, bytes) else type(payload).SerializeToString

    async def _unary(
        self,
        channel: grpc.aio.Channel,
        method: Method,
        payload: Message | bytes,
        metadata: tuple[tuple[str, str], ...],
        problem: str,
    ) -> web.Response:
        call = channel.unary_unary(
            method.path,
            request_serializer=self._serializer(payload),
            response_deserializer=method.response.FromString,
        )
        try:
            response = await call(payload, metadata=metadata)
        except grpc.aio.AioRpcError as error:
            return status_response(self._refusal(error, method, problem))
        return web.json_response(json_format.MessageToDict(response), dumps=_dumps)

    async def _stream(
        self,
        channel: grpc.aio.Channel,
        request: web.Request,
        method: Method,
        payload: Message | bytes,
        metadata: tuple[tuple[str, str], ...],
        problem: str,
    ) -> web.StreamResponse:
        call = channel.unary_stream(
            method.path,
            request_serializer=self._serializer(payload),
            response_deserializer=method.response.FromString,
        )(payload, metadata=metadata)
        try:
            # Until the first response the call can still be refused as a whole: that
            # refusal is an HTTP status, not an event.
            try:
                first = await call.read()
            except grpc.aio.AioRpcError as error:
                return status_response(self._refusal(error, method, problem))
            response = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-store",
                    "X-Accel-Buffering": "no",
                }
            )
            await response.prepare(request)
            item = first
            while item is not grpc.aio.EOF:
                assert isinstance(item, Message)
                await response.write(sse("message", json_format.MessageToDict(item), _last(item)))
                try:
                    item = await call.read()
                except grpc.aio.AioRpcError as error:
                    await response.write(sse("error", status_json(status_of_error(error))))
                    break
            else:
                await response.write(sse("end", {}))
            await response.write_eof()
            return response
        finally:
            call.cancel()

    def _refusal(
        self, error: grpc.aio.AioRpcError, method: Method, problem: str
    ) -> status_pb2.Status:
        status = status_of_error(error)
        if problem and error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            # The server refused the undecodable stand-in (the caller passed the token
            # check): say what was wrong with the JSON itself.
            return rich_status(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request body is not a valid {method.request.DESCRIPTOR.full_name}"
                f" in JSON ({problem})",
                "MALFORMED_REQUEST",
            )
        return status


def _last(item: Message) -> str:
    """The SSE id of a stream response: the seq of its last session event, if any."""
    if not isinstance(item, agent_service_pb2.StreamSessionEventsResponse):
        return ""  # StreamAgentEvents: agent events have no seq, and nothing is replayed
    return str(item.events[-1].seq) if item.events else ""


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def tls_context(cert_file: str, key_file: str, client_ca_file: str) -> ssl.SSLContext | None:
    """The HTTP side's TLS: the gRPC listener's certificate, and its client CA (mutual)."""
    if not cert_file:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
