"""An interceptor that keeps client mistakes client-side.

Undecodable bodies and too many concurrent streams are refused with a status, never an
UNKNOWN with a logged traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message

from server.edge.api_integers import INT64_MAX, too_large
from server.edge.status import abort, abort_with, rich_status
from server.kernel.errors import InvalidArgument
from server.kernel.limits import Limits

if TYPE_CHECKING:  # the grpc stubs are generic only to the type checker
    Context = grpc.aio.ServicerContext[Any, Any]

log = logging.getLogger(__name__)

LOG_INTERVAL = 1.0
"""Seconds between two log lines about refused bodies: a flood of them writes one a second."""

STREAM_METHOD = "/agentloop.v1.AgentService/StreamSessionEvents"
"""The long-lived call whose concurrency `limits.maxStreams` bounds."""


@dataclass(frozen=True)
class Undecodable:
    """What the guarded deserializer returns for bytes that do not parse."""

    problem: str
    field: str = ""
    """The field whose value no message of ours may hold (an integer out of range)."""


class RequestGuard:
    """Decodes requests without raising and counts the open event streams (`Edge` calls it)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.streams = 0
        """StreamSessionEvents calls open now."""

    def wrap(self, handler: Any, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        """`handler` (with a unary request) decoding without raising, its streams counted."""
        decode = guarded(handler.request_deserializer)
        kwargs = {
            "request_deserializer": decode,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary), **kwargs)
        behaviour = self._streaming(handler.unary_stream, method == STREAM_METHOD)
        return grpc.unary_stream_rpc_method_handler(behaviour, **kwargs)

    def _unary(self, behaviour: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        async def unary(request: Any, context: Context) -> Any:
            if isinstance(request, Undecodable):
                await refuse(context, request)
            return await behaviour(request, context)

        return unary

    async def admit(self, request: Any, context: Context, counted: bool) -> None:
        """Refuse an undecodable body, or a counted stream past the limit; count it open.

        The caller decrements `streams` by `counted` when the stream ends.
        """
        if isinstance(request, Undecodable):
            await refuse(context, request)
        if counted and self.streams >= self.limits.max_streams:
            await abort_with(
                context,
                rich_status(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"too many open event streams: {self.limits.describe('max_streams')}",
                    "LIMIT_EXCEEDED",
                    {"limit": "max_streams"},
                ),
            )
        self.streams += counted

    def _streaming(
        self, behaviour: Callable[..., Any], counted: bool
    ) -> Callable[..., AsyncIterator[Any]]:
        async def streaming(request: Any, context: Context) -> AsyncIterator[Any]:
            await self.admit(request, context, counted)
            try:
                result = behaviour(request, context)
                if hasattr(result, "__aiter__"):
                    async for response in result:
                        yield response
                else:  # a handler that writes with `context.write` (health's Watch)
                    await result
            finally:
                self.streams -= counted

        return streaming


def guarded(decode: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`decode`, returning `Undecodable` instead of raising."""
    if decode is None:
        return None

    def safe(data: bytes) -> Any:
        try:
            request = decode(data)
        except Exception as error:  # any parse failure is the client's
            return Undecodable(f"{type(error).__name__}: {error}"[:200])
        field = too_large(request) if isinstance(request, Message) else ""
        if field:
            return Undecodable(f"must be at most {INT64_MAX}", field)
        return request

    return safe


class _RateLimitedLog:
    """INFO lines at most once per `LOG_INTERVAL`, with the count of those left out."""

    def __init__(self) -> None:
        self.last = 0.0
        self.skipped = 0

    def info(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self.last < LOG_INTERVAL:
            self.skipped += 1
            return
        self.last, skipped, self.skipped = now, self.skipped, 0
        log.info(message + " (%d more since the last such line)", *args, skipped)


_refusals = _RateLimitedLog()


async def refuse(context: Context, request: Undecodable) -> None:
    """Abort INVALID_ARGUMENT; logged at INFO, rate-limited: the fault is the client's."""
    _refusals.info("refused an undecodable request body: %s", request.problem)
    if request.field:
        await abort(context, InvalidArgument(request.field, request.problem))
    await abort_with(
        context,
        rich_status(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request body is not a valid message ({request.problem})",
            "MALFORMED_REQUEST",
        ),
    )
