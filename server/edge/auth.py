"""Bearer-token authentication of every RPC but health and reflection."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from typing import Any

import grpc

OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
"""Services anyone may call: operators probe them without a token."""


class TokenAuth:
    """Refuses calls whose `authorization` metadata is not `Bearer <token>` (`Edge` asks it)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def refused(self, handler_call_details: grpc.HandlerCallDetails) -> str:
        """Why the call is refused ("missing token", "wrong token"); "" when it may pass."""
        if (handler_call_details.method or "").startswith(OPEN_PREFIXES):
            return ""
        presented = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if isinstance(presented, str):
            presented = presented.encode()
        if hmac.compare_digest(presented, self._expected):
            return ""
        return "missing token" if not presented else "wrong token"


def refusal(handler: grpc.RpcMethodHandler[Any, Any], why: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as `handler` that aborts UNAUTHENTICATED."""
    message = f"{why}: send metadata 'authorization: Bearer <token>'"

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - never reached: abort raises

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)
    return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)
