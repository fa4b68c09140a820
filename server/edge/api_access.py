"""The outermost interceptor: an access log line per RPC, its metrics and its span.

The line is at INFO, on the `agentloop.access` logger, with `method`, `code`,
`duration_ms` and `peer` as fields. Metrics and the span only when they are on; the
span continues the client's trace when the call carries a `traceparent`, and the next
turn to start after a message, a steer or injected context links to the span of its RPC.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:  # metrics and tracing are imported only when they are on
    from opentelemetry.trace import SpanContext

    from server.observability.metrics import Metrics
    from server.observability.tracing import Tracing

if TYPE_CHECKING:
    Context = grpc.aio.ServicerContext[Any, Any]

log = logging.getLogger("agentloop.access")

CLIENT_KEY = "agentloop-http-client"
RELAY_KEY = "agentloop-http-relay"
"""The metadata the HTTP side adds to a call it forwards (`api_http`)."""

QUEUEING = frozenset(
    "/agentloop.v1.AgentService/" + name
    for name in ("SendMessage", "SteerMessage", "InjectContext")
)
"""The RPCs that queue work for an agent's next turn: its span links to theirs."""


class AccessLog:
    """Wraps a handler to time it and learn its status (`Edge` calls it)."""

    def __init__(self, metrics: Metrics | None = None, tracing: Tracing | None = None) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self.relay_key = ""
        """The HTTP side's secret (when it is on): a call over its private socket that
        carries it is logged with the HTTP client's address, not the socket's."""

    def wrap(self, handler: Any, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        """`handler`, timed and logged."""
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method), **kwargs
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, method), **kwargs
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, method), **kwargs
            )
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, method), **kwargs
        )

    def _unary(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Awaitable[Any]]:
        async def unary(request: Any, context: Context) -> Any:
            with self.observed(method, context) as observation:
                return await observation.run(behaviour, request, context)

        return unary

    def _streaming(
        self, behaviour: Callable[..., Any], method: str
    ) -> Callable[..., AsyncIterator[Any]]:
        async def streaming(request: Any, context: Context) -> AsyncIterator[Any]:
            with self.observed(method, context):
                result = behaviour(request, context)
                if hasattr(result, "__aiter__"):
                    async for response in result:
                        yield response
                else:  # a handler that writes with `context.write` (health's Watch)
                    await result

        return streaming

    def observed(self, method: str, context: Context) -> Observation:
        """Around one call: its span, its metrics and its access log line."""
        return Observation(self, method, context)


class Observation:
    """One call observed (`AccessLog.observed`): a plain context manager, no generator.

    The peer is asked for only when something records it (the span, the log line),
    and only at the start: once a call is cancelled, gRPC may have let go of it.
    """

    __slots__ = ("access", "context", "method", "peer", "span", "started")

    def __init__(self, access: AccessLog, method: str, context: Context) -> None:
        self.access = access
        self.method = method
        self.context = context
        self.started = time.perf_counter()
        tracing = access.tracing
        recorded = tracing is not None or log.isEnabledFor(logging.INFO)
        self.peer = _peer(context, access.relay_key) if recorded else None
        # The span is never made current: nothing under it needs it as parent.
        self.span = (
            tracing.rpc(method, self.peer or "", _caller(context)) if tracing is not None else None
        )

    def __enter__(self) -> Observation:
        return self

    def run(self, behaviour: Callable[..., Any], request: Any, context: Context) -> Awaitable[Any]:
        """A unary call's behaviour, to await.

        A traced call that queues work for an agent links the agent's next turn to this
        call's span. Else the behaviour's own coroutine: no layer of this one's, which
        each of the call's wake-ups would pass through.
        """
        tracing, span = self.access.tracing, self.span
        if tracing is None or span is None or self.method not in QUEUEING:
            return behaviour(request, context)  # type: ignore[no-any-return]
        return self._traced(tracing, span, behaviour, request, context)

    async def _traced(
        self,
        tracing: Tracing,
        span: Any,
        behaviour: Callable[..., Any],
        request: Any,
        context: Context,
    ) -> Any:
        tracing.caused(request.agent_id, span)  # before: the turn may start first
        try:
            return await behaviour(request, context)
        except BaseException:  # refused: nothing was queued
            tracing.forget(request.agent_id, span)
            raise

    def __exit__(self, kind: type[BaseException] | None, error: object, trace: object) -> None:
        context = self.context
        if kind is None:
            code = _code(context, "OK")
        elif issubclass(kind, grpc.aio.AbortError):
            code = _code(context, "UNKNOWN")
        else:
            code = "CANCELLED" if issubclass(kind, asyncio.CancelledError) else "UNKNOWN"
        seconds = time.perf_counter() - self.started
        access = self.access
        if self.span is not None and access.tracing is not None:
            access.tracing.end_rpc(self.span, code, _number(code))
        if access.metrics is not None:
            access.metrics.rpc(self.method, code, seconds)
        if self.peer is not None and log.isEnabledFor(logging.INFO):
            log.info(
                "rpc",  # everything is in the fields
                extra={
                    "method": self.method,
                    "code": code,
                    "duration_ms": round(seconds * 1000, 3),
                    "peer": self.peer,
                },
            )


def _peer(context: Context, relay_key: str) -> str:
    """The caller's address: the HTTP client's for a call the HTTP side forwarded."""
    peer = context.peer() or ""
    if relay_key and peer.startswith("unix:"):
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get(RELAY_KEY) == relay_key:
            return str(metadata.get(CLIENT_KEY, peer))
    return peer


def _caller(context: Context) -> SpanContext | None:
    """The client's span, from the call's `traceparent` (and `tracestate`) metadata."""
    from server.observability.tracing import parse_traceparent  # tracing is on: loaded

    parent = state = ""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            parent = value
        elif key == "tracestate" and isinstance(value, str):
            state = value
    return parse_traceparent(parent, state) if parent else None


def _code(context: Context, default: str) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if isinstance(code, int) and code:
        for status in grpc.StatusCode:
            if status.value[0] == code:
                return str(status.name)
    return default


def _number(code: str) -> int:
    return int(grpc.StatusCode[code].value[0]) if code in grpc.StatusCode.__members__ else 2
