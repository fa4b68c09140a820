"""Any replica answers any call: calls for an agent owned elsewhere go to its owner.

An interceptor of the agent-scoped methods (those that name an `agent_id`): when the
agent is not live here but another replica holds its lease, the call is made again on
that replica, with the caller's metadata (its token) and a marker that stops it from
being forwarded twice, and the answer (or the status, or the stream of responses) is
passed back unchanged. An agent between owners, or an owner that does not answer (it
died, or is cut off), is `UNAVAILABLE` with reason `AGENT_MOVING` and a retry delay
(`server.cluster.routing`). Calls by session id are served from the shared store by
any replica and are never forwarded.

Calls about an agent's children go to the parent's owner, where the tree lives: a
`CreateAgent` with a `parent` (the child is made beside its parent, which owns it and
tears it down), and a `ListAgents` with `parent_agent_id`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message

from agentloop.v1 import agent_factory_service_pb2, agent_service_pb2
from server.edge.status import abort
from server.kernel.errors import AgentLoopError
from server.stores import StoreUnavailable

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

OwnerAddress = Callable[[str, bool], Awaitable[str | None]]
"""The owner's address of an agent (given whether the call was forwarded already); None
to answer here; raises a domain error (the agent is moving) to refuse the call."""

Moving = Callable[[str], AgentLoopError]
"""The refusal of a call whose owner did not answer."""

ASK_TIMEOUT = 5.0
"""Seconds a replica waits for another one it asks (a list of agents)."""


MAKERS = {"CreateAgent", "ResumeAgent"}
"""Methods that name an agent id to make an agent: served where they are called (unless
a parent is named: see `PARENTED`)."""

Route = Callable[[Any], str]
"""The agent id a request is about: its call goes to that agent's owner."""


def _by_agent_id(request: Any) -> str:
    agent_id = getattr(request, "agent_id", "")
    return agent_id if isinstance(agent_id, str) else ""


PARENTED: dict[str, tuple[type[Message], Route]] = {
    "/agentloop.v1.AgentFactoryService/CreateAgent": (
        agent_factory_service_pb2.CreateAgentResponse,
        lambda request: request.parent.agent_id if request.HasField("parent") else "",
    ),
    "/agentloop.v1.AgentFactoryService/ListAgents": (
        agent_factory_service_pb2.ListAgentsResponse,
        lambda request: request.parent_agent_id,
    ),
}
"""Methods routed by a parent they name: to the replica that owns the parent."""


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

ROUTES: dict[str, tuple[type[Message], Route]] = {
    **{path: (response, _by_agent_id) for path, response in AGENT_METHODS.items()},
    **PARENTED,
}
"""Every forwardable method: its response type and the agent id it is routed by."""


class Forwarder(grpc.aio.ServerInterceptor):
    """Sends agent calls to the replica that owns the agent."""

    def __init__(
        self,
        is_local: Callable[[str], bool],
        owner_address: OwnerAddress,
        moving: Moving,
        token: str = "",
        credentials: grpc.ChannelCredentials | None = None,
        watch_seconds: float = 1.0,
    ) -> None:
        self.is_local = is_local
        self.owner_address = owner_address
        self.moving = moving
        self.watch_seconds = watch_seconds
        """While a forwarded unary call waits, how often the owner's lease is checked."""
        self.token = token
        """The server's own token, for the calls it makes of its own accord."""
        self.credentials = credentials
        """TLS to the other replicas (they serve TLS when this one does); None: plaintext."""
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._owners: dict[str, tuple[str, float]] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap the agent-scoped methods; leave the others as they are."""
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        route = ROUTES.get(method)
        if handler is None or route is None:
            return handler
        response_type, routed_by = route
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            local_unary: Any = handler.unary_unary

            async def unary(request: Any, context: Context) -> Any:
                address = await self._elsewhere(routed_by(request), context)
                if address is None:
                    return await local_unary(request, context)
                return await self._forward(
                    address, method, response_type, request, context, routed_by(request)
                )

            return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
        local_stream: Any = handler.unary_stream

        async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
            address = await self._elsewhere(routed_by(request), context)
            if address is None:
                async for response in local_stream(request, context):
                    yield response
                return
            async for response in self._forward_stream(
                address, method, response_type, request, context, routed_by(request)
            ):
                yield response

        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)

    async def ask(
        self,
        address: str,
        method: str,
        request: Message,
        response_type: type[Message],
        seconds: float = ASK_TIMEOUT,
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
        return await call(request, metadata=metadata, timeout=seconds)

    async def close(self) -> None:
        """Close the channels to other replicas."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def _elsewhere(self, agent_id: str, context: Context) -> str | None:
        """The owner's address when the call is for an agent another replica owns."""
        if not agent_id or self.is_local(agent_id):
            return None
        forwarded = any(key == FORWARDED for key, _ in context.invocation_metadata() or ())
        now = time.monotonic()
        cached = self._owners.get(agent_id)
        if cached is not None and cached[1] > now and not forwarded:
            return cached[0]
        try:
            address = await self.owner_address(agent_id, forwarded)
        except AgentLoopError as error:  # between owners
            await abort(context, error)
        if address is not None and not forwarded:
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
        agent_id: str,
    ) -> Any:
        call = self._channel(address).unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        answer = asyncio.ensure_future(
            _awaited(
                call(request, metadata=self._metadata(context), timeout=context.time_remaining())
            )
        )
        try:
            while True:  # an owner that is paused or cut off never answers: watch its lease
                done, _ = await asyncio.wait({answer}, timeout=self.watch_seconds)
                if done:
                    return answer.result()
                if not await self._still_owner(agent_id, address):
                    self._owners.pop(agent_id, None)
                    await abort(context, self.moving(agent_id))
        except grpc.aio.AioRpcError as error:
            await self._refused(error, agent_id, context)
        finally:
            answer.cancel()

    async def _still_owner(self, agent_id: str, address: str) -> bool:
        """Whether the replica at `address` still holds the agent's lease (or none can tell)."""
        try:
            return await self.owner_address(agent_id, False) == address
        except StoreUnavailable:  # the database cannot say now: keep waiting for the owner
            return True
        except AgentLoopError:  # expired, or taken by this replica: moving
            return False

    async def _forward_stream(
        self,
        address: str,
        method: str,
        response_type: type[Message],
        request: Message,
        context: Context,
        agent_id: str,
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
            await self._refused(error, agent_id, context)
        finally:
            responses.cancel()

    async def _refused(self, error: grpc.aio.AioRpcError, agent_id: str, context: Context) -> None:
        """Pass the owner's refusal on; an owner that did not answer means "moving"."""
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            self._owners.pop(agent_id, None)  # ask the leases again next time
            if not _has_details(error):  # not the owner's answer: it is gone or cut off
                await abort(context, self.moving(agent_id))
        await _abort_as(error, context)


async def _awaited(call: Any) -> Any:
    return await call


def _has_details(error: grpc.aio.AioRpcError) -> bool:
    """Whether a status came from a server of ours (rich details), not from the transport."""
    return any(key == "grpc-status-details-bin" for key, _ in error.trailing_metadata() or ())


async def _abort_as(error: grpc.aio.AioRpcError, context: Context) -> None:
    """End the call with the owner's status and its rich details.

    Field violations and error info travel in the trailing metadata.
    """
    trailing = tuple((key, value) for key, value in error.trailing_metadata() or ())
    await context.abort(error.code(), error.details() or "", trailing_metadata=trailing)
