"""The edge interceptors folded into one: one interception and one wrapper per call.

The server's edge is, outermost first: the access log (`AccessLog`), token
authentication (`TokenAuth`, when a token is set) and the request guard
(`RequestGuard`). As three chained interceptors, each would be a coroutine per call
and a wrapper per handler, so every response of a stream would pass through one
generator per layer. `Edge` does it in one interception and, for an authenticated
call, one wrapper that logs, guards and runs the handler; a refused call takes the
parts' own wrappers (rare, and the same behaviour by construction). A server with no
other interceptor has none at all: its `MethodTable` wraps each call's handler with
`Edge.handler` as it finds it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from server.edge.api_access import AccessLog
from server.edge.api_guard import STREAM_METHOD, RequestGuard, Undecodable, guarded, refuse
from server.edge.auth import TokenAuth, refusal
from server.edge.status import abort_unexpected

if TYPE_CHECKING:
    Continuation = Callable[
        [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
    ]
    Context = grpc.aio.ServicerContext[Any, Any]


class Edge(grpc.aio.ServerInterceptor):
    """`AccessLog`, then `TokenAuth` (if any), then `RequestGuard`, as one interceptor."""

    def __init__(self, access: AccessLog, guard: RequestGuard, auth: TokenAuth | None) -> None:
        self.access = access
        self.guard = guard
        self.auth = auth
        self._wrapped: dict[str, tuple[object, grpc.RpcMethodHandler[Any, Any]]] = {}
        """Per method, the handler last wrapped and its wrapper: built once, not per call."""

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The handler wrapped as the chain would wrap it."""
        handler = await continuation(handler_call_details)
        return None if handler is None else self.handler(handler, handler_call_details)

    def handler(
        self, handler: grpc.RpcMethodHandler[Any, Any], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """`handler` of the called method, wrapped as the chain would wrap it.

        What `intercept_service` returns; a `MethodTable` calls it as it finds the handler,
        with no interceptor (and its coroutines) per call.
        """
        method = details.method or ""
        why = self.auth.refused(details) if self.auth is not None else ""
        if why:  # as the chain: the guard's handler, refused, inside the access log
            inner = handler
            if not handler.request_streaming:
                inner = self.guard.wrap(handler, method)
            return self.access.wrap(refusal(inner, why), method)
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: Any, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        if handler.request_streaming:  # the guard leaves these as they are
            return self.access.wrap(handler, method)
        kwargs = {
            "request_deserializer": guarded(handler.request_deserializer),
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method), **kwargs
            )
        return grpc.unary_stream_rpc_method_handler(
            self._streaming(handler.unary_stream, method, method == STREAM_METHOD), **kwargs
        )

    def _unary(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Awaitable[Any]]:
        observed = self.access.observed

        async def unary(request: Any, context: Context) -> Any:
            with observed(method, context) as observation:
                if isinstance(request, Undecodable):
                    await refuse(context, request)
                try:
                    return await observation.run(behaviour, request, context)
                except grpc.aio.AbortError:
                    raise
                except Exception as error:  # unmapped: a status all the same, never UNKNOWN
                    await abort_unexpected(context, error)

        return unary

    def _streaming(
        self, behaviour: Callable[..., Any], method: str, counted: bool
    ) -> Callable[..., AsyncIterator[Any]]:
        observed, guard = self.access.observed, self.guard

        async def streaming(request: Any, context: Context) -> AsyncIterator[Any]:
            with observed(method, context):
                await guard.admit(request, context, counted)
                try:
                    result = behaviour(request, context)
                    if hasattr(result, "__aiter__"):
                        async for response in result:
                            yield response
                    else:  # a handler that writes with `context.write` (health's Watch)
                        await result
                except grpc.aio.AbortError:
                    raise
                except Exception as error:  # a store outage mid-stream ends it UNAVAILABLE
                    await abort_unexpected(context, error)
                finally:
                    guard.streams -= counted

        return streaming
