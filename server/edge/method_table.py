"""Every service's methods in one dictionary, handed to the server as one generic handler.

The generated `add_…Servicer_to_server` functions give the server each service twice:
as a generic handler and as "registered" methods. grpc.aio (1.85) keeps one pending
request-call task per registered method and, for every call it accepts, waits on all
of them again (`asyncio.wait` over the whole set: five Python-level steps per method,
some 200 function calls per RPC with our 29 methods, a new SendMessage each turn).
Served as generic methods, a call is one pending task; the method is found by one
dictionary lookup here. What a call does, and its status for an unknown method
(UNIMPLEMENTED), are the same.

`MethodTable` stands in for the server while the services register (it has the two
methods the generated code calls), then `install` hands it to the server. With an
`edge`, each call's handler is wrapped (logged, authenticated, guarded) as it is found:
the server then needs no interceptor, whose coroutines (three per call in grpc.aio's
chain) would run for every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:  # the grpc stubs are generic only to the type checker
    Handler = grpc.RpcMethodHandler[Any, Any]


class MethodTable(grpc.GenericRpcHandler):
    """The servers' methods by full name (`/package.Service/Method`)."""

    def __init__(self) -> None:
        self.methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self.others: list[grpc.GenericRpcHandler] = []
        """Generic handlers of services that did not register their methods (reflection)."""
        self.edge: Callable[[Handler, grpc.HandlerCallDetails], Handler] | None = None
        """What wraps the handler of every call (`Edge.handler`), if anything does."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        """Take a service's methods (the generated code's second call)."""
        for name, handler in handlers.items():
            self.methods[f"/{service}/{name}"] = handler
        # The generated code gave the same methods as a generic handler first: drop it.
        self.others = [h for h in self.others if _service_name(h) != service]

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        """Take generic handlers; a service's own is dropped once its methods come."""
        self.others.extend(h for h in handlers if _service_name(h) not in self._services())

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The handler of the called method (through `edge`), or None (UNIMPLEMENTED)."""
        handler = self.methods.get(handler_call_details.method)
        if handler is None:
            for other in self.others:
                handler = other.service(handler_call_details)
                if handler is not None:
                    break
            else:
                return None
        return handler if self.edge is None else self.edge(handler, handler_call_details)

    def install(self, server: grpc.aio.Server) -> None:
        """Serve every method taken (and any taken later) through `server`."""
        server.add_generic_rpc_handlers((self,))

    def _services(self) -> set[str]:
        return {name.split("/")[1] for name in self.methods}


def _service_name(handler: grpc.GenericRpcHandler) -> str:
    name = getattr(handler, "service_name", None)
    return str(name()) if callable(name) else ""
