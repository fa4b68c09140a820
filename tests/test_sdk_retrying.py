"""The Python SDK retries `AGENT_MOVING` and `STORE_UNAVAILABLE` by itself, same request id.

A real gRPC server on a port stands in for a replica whose agent is moving: it refuses
the first sends with `UNAVAILABLE`, reason `AGENT_MOVING` and a `RetryInfo`, then
accepts. The SDK's client (`connect`) sees only the acceptance, and every attempt
carried the same request id. A refusal with another reason, or none, is not retried;
nor is a call past its deadline. A stream ended that way is reopened from its last seq
after the server's delay, more times than its reconnects allow for other failures.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from agentloop.client import connect
from agentloop.stream import RECONNECTS, SessionStream
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev

SEND = "/agentloop.v1.AgentService/SendMessage"


class Moving:
    """Refuses the first `refusals` sends with `reason`, then accepts; records the ids."""

    def __init__(self, refusals: int, reason: str, delay: float = 0.05) -> None:
        self.refusals = refusals
        self.reason = reason
        self.delay = delay
        self.request_ids: list[str] = []
        self.opened: list[float] = []
        """When each stream call began, and when each refused one was ended."""
        self.ended: list[float] = []

    async def send(self, request: api.SendMessageRequest, context: Any) -> Any:
        self.request_ids.append(request.request_id)
        if len(self.request_ids) <= self.refusals:
            info = error_details_pb2.ErrorInfo(reason=self.reason, domain="agentloop.v1")
            details = [_packed(info)]
            if self.delay:
                retry = error_details_pb2.RetryInfo()
                retry.retry_delay.FromNanoseconds(int(self.delay * 1e9))
                details.append(_packed(retry))
            status = rpc_status.to_status(
                status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message="moving",
                                  details=details)
            )  # fmt: skip
            await context.abort(status.code, status.details, status.trailing_metadata)
        return api.SendMessageResponse()

    async def stream(self, request: api.StreamSessionEventsRequest, context: Any) -> Any:
        """The first call: an event, then the refusal; the next are refused at once, the
        last gives three events and ends."""
        self.request_ids.append(str(request.from_seq))
        self.opened.append(time.monotonic())
        calls = len(self.request_ids)
        seq = request.from_seq
        if calls <= self.refusals:
            if calls == 1:
                yield api.StreamSessionEventsResponse()  # the subscription, confirmed
                yield api.StreamSessionEventsResponse(events=[ev.SessionEvent(seq=seq)])
            self.ended.append(time.monotonic())
            status = self._refusal()
            await context.abort(status.code, status.details, status.trailing_metadata)
        yield api.StreamSessionEventsResponse()
        yield api.StreamSessionEventsResponse(
            events=[ev.SessionEvent(seq=n) for n in range(seq, seq + 3)]
        )

    def _refusal(self) -> Any:
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain="agentloop.v1")
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromNanoseconds(int(self.delay * 1e9))
        return rpc_status.to_status(
            status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message="moving",
                              details=[_packed(info), _packed(retry)])
        )  # fmt: skip


def _packed(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[grpc.aio.Server] = []

    async def start(behaviour: Moving) -> str:
        handler = grpc.method_handlers_generic_handler(
            "agentloop.v1.AgentService",
            {
                "SendMessage": grpc.unary_unary_rpc_method_handler(
                    behaviour.send,
                    request_deserializer=api.SendMessageRequest.FromString,
                    response_serializer=api.SendMessageResponse.SerializeToString,
                ),
                "StreamSessionEvents": grpc.unary_stream_rpc_method_handler(
                    behaviour.stream,
                    request_deserializer=api.StreamSessionEventsRequest.FromString,
                    response_serializer=api.StreamSessionEventsResponse.SerializeToString,
                ),
            },
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        await server.stop(None)


@pytest.mark.parametrize("reason", ["AGENT_MOVING", "STORE_UNAVAILABLE"])
async def test_a_moving_agent_is_retried_with_the_same_request_id(serve: Any, reason: str) -> None:
    moving = Moving(refusals=3, reason=reason)
    client = connect(await serve(moving))
    try:
        request = api.SendMessageRequest(agent_id="a", text="hi", request_id="once")
        await client.agents.SendMessage(request, timeout=5)
    finally:
        await client.close()
    assert moving.request_ids == ["once"] * 4


async def test_other_refusals_are_the_callers(serve: Any) -> None:
    moving = Moving(refusals=3, reason="SOMETHING_ELSE")
    client = connect(await serve(moving))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.agents.SendMessage(api.SendMessageRequest(agent_id="a"), timeout=5)
    finally:
        await client.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(moving.request_ids) == 1


async def test_retries_stop_at_the_deadline(serve: Any) -> None:
    moving = Moving(refusals=1000, reason="AGENT_MOVING", delay=0.2)
    client = connect(await serve(moving))
    began = time.monotonic()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.agents.SendMessage(api.SendMessageRequest(agent_id="a"), timeout=1)
    finally:
        await client.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - began < 3
    assert 2 <= len(moving.request_ids) < 20


@pytest.mark.parametrize("reason", ["AGENT_MOVING", "STORE_UNAVAILABLE"])
async def test_a_stream_ended_moving_waits_the_servers_delay_and_keeps_its_reconnects(
    serve: Any, reason: str
) -> None:
    refusals = RECONNECTS + 3  # in a row: more than any other failure may use
    moving = Moving(refusals=refusals, reason=reason, delay=0.3)
    client = connect(await serve(moving))
    stream = SessionStream(lambda: client.agents, session_id="s", from_seq=1)
    try:
        seqs = [event.seq async for event in stream]
    finally:
        stream.close()
        await client.close()
    assert seqs == [1, 2, 3, 4]  # resumed from the last seq
    assert moving.request_ids == ["1"] + ["2"] * refusals
    assert stream.reconnects == refusals
    waits = [opened - ended for ended, opened in zip(moving.ended, moving.opened[1:], strict=True)]
    assert min(waits) >= 0.5 * moving.delay, waits  # the server's delay, jittered (half at least)
