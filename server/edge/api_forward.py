"""Any replica answers any call: calls for an agent owned elsewhere go to its owner.

An interceptor of the agent-scoped methods (those that name an `agent_id`): when the
agent is not live here but another replica holds its lease, the call is made again on
that replica, with the caller's metadata (its token) and a marker that stops it from
being forwarded twice, and the answer (or the status, or the stream of responses) is
passed back unchanged. Calls by session id are served from the shared store by any
replica and are never forwarded.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message

from agentloop.v1 import agent_factory_service_pb2, agent_service_pb2

if TYPE_CHECKING:
    Continuation = Callable[
        [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
    ]
    Context = grpc.aio.ServicerContext[Any, Any]

FORWARDED = "agentloop-forwarded"
"""Metadata set on a forwarded call: its receiver serves it, whatever it owns."""

OWNER_CACHE_SECONDS = 0.5
"""How long an owner's address is reused before the leases are asked again (a failover
shows after at most this long; a call to a dead owner also drops its entry)."""

OwnerAddress = Callable[[str], Awaitable[str | None]]

ASK_TIMEOUT = 5.0
"""Seconds a replica waits for another one it asks (a list of agents)."""


MAKERS = {"CreateAgent", "ResumeAgent"}
"""Methods that name an agent id to make an agent: served where they are called."""


def _agent_methods() -> dict[str, type[Message]]:
    """Each forwardable method's path and its response type.

    Every method whose request names an `agent_id`, except those that make one: a new
    agent RPC is forwarded without being listed here.
    """
    methods: dict[str, type[Message]] = {}
    for module in (agent_service_pb2, agent_factory_service_pb2):
        for descriptor in module.DESCRIPTOR.services_by_name.values():
            for method in descriptor.methods:
                if method.name in MAKERS or "agent_id" not in method.input_type.fields_by_name:
                    continue
                output = message_factory.GetMessageClass(method.output_type)
                methods[f"/{descriptor.full_name}/{method.name}"] = output
    return methods


AGENT_METHODS = _agent_methods()


class Forwarder(grpc.aio.ServerInterceptor):
    """Sends agent calls to the replica that owns the agent."""

    def __init__(
        self,
        is_local: Callable[[str], bool],
        owner_address: OwnerAddress,
        token: str = "",
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.is_local = is_local
        self.owner_address = owner_address
        self.token = token
        """The server's own token, for the calls it makes of its own accord."""
        self.credentials = credentials
        """TLS to the other replicas (they serve TLS when this one does); None: plaintext."""
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._owners: dict[str, tuple[str | None, float]] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap the agent-scoped methods; leave the others as they are."""
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        response_type = AGENT_METHODS.get(method)
        if handler is None or response_type is None:
            return handler
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            local_unary: Any = handler.unary_unary

            async def unary(request: Any, context: Context) -> Any:
                address = await self._elsewhere(request, context)
                if address is None:
                    return await local_unary(request, context)
                return await self._forward(address, method, response_type, request, context)

            return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
        local_stream: Any = handler.unary_stream

        async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
            address = await self._elsewhere(request, context)
            if address is None:
                async for response in local_stream(request, context):
                    yield response
                return
            async for response in self._forward_stream(
                address, method, response_type, request, context
            ):
                yield response

        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)

    async def ask(
        self, address: str, method: str, request: Message, response_type: type[Message]
    ) -> Any:
        """Call another replica of this server's own accord (answered there, not forwarded)."""
        call = self._channel(address).unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        metadata: list[tuple[str, str | bytes]] = [(FORWARDED, "1")]
        if self.token:
            metadata.append(("authorization", f"Bearer {self.token}"))
        return await call(request, metadata=metadata, timeout=ASK_TIMEOUT)

    async def close(self) -> None:
        """Close the channels to other replicas."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def _elsewhere(self, request: Any, context: Context) -> str | None:
        """The owner's address when the call is for an agent another replica owns."""
        agent_id = getattr(request, "agent_id", "")
        if not isinstance(agent_id, str) or not agent_id or self.is_local(agent_id):
            return None
        if any(key == FORWARDED for key, _ in context.invocation_metadata() or ()):
            return None  # forwarded once already: answer here
        now = time.monotonic()
        cached = self._owners.get(agent_id)
        if cached is not None and cached[1] > now:
            return cached[0]
        address = await self.owner_address(agent_id)
        if len(self._owners) > 10_000:
            self._owners.clear()
        self._owners[agent_id] = (address, now + OWNER_CACHE_SECONDS)
        return address

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = (
                grpc.aio.secure_channel(address, self.credentials)
                if self.credentials is not None
                else grpc.aio.insecure_channel(address)
            )
        return channel

    def _metadata(self, context: Context) -> list[tuple[str, str | bytes]]:
        passed = [(k, v) for k, v in context.invocation_metadata() or () if k == "authorization"]
        return [*passed, (FORWARDED, "1")]

    async def _forward(
        self,
        address: str,
        method: str,
        response_type: type[Message],
        request: Message,
        context: Context,
    ) -> Any:
        call = self._channel(address).unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        try:
            return await call(
                request, metadata=self._metadata(context), timeout=context.time_remaining()
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                self._owners.pop(getattr(request, "agent_id", ""), None)  # ask again next time
            await _abort_as(error, context)

    async def _forward_stream(
        self,
        address: str,
        method: str,
        response_type: type[Message],
        request: Message,
        context: Context,
    ) -> AsyncIterator[Any]:
        call = self._channel(address).unary_stream(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        responses = call(request, metadata=self._metadata(context))
        try:
            async for response in responses:
                yield response
        except grpc.aio.AioRpcError as error:
            await _abort_as(error, context)
        finally:
            responses.cancel()


async def _abort_as(error: grpc.aio.AioRpcError, context: Context) -> None:
    """End the call with the owner's status and its rich details.

    Field violations and error info travel in the trailing metadata.
    """
    trailing = tuple((key, value) for key, value in error.trailing_metadata() or ())
    await context.abort(error.code(), error.details() or "", trailing_metadata=trailing)
