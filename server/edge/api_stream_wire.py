"""StreamSessionEvents responses written as bytes: no copy of each event into a response.

A response is a `StreamSessionEventsResponse`; its `events` field (1) is a repeated
message, so its wire form is each event's bytes behind a tag and a length, and a
message's fields may come in any order. The servicer hands gRPC those bytes, and the
method's serializer passes bytes through (a message, such as a forwarded replica's
response, is serialized as before): the events are not deep-copied into a response,
and their bytes are those the session serialized once for the store and every stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from agentloop.plugin.transport import field_key, varint
from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_service_pb2 as pb
from agentloop.v1 import agent_service_pb2_grpc as rpc
from server.edge.method_table import MethodTable

SERVICE = "agentloop.v1.AgentService"
EVENTS_TAG = field_key(pb.StreamSessionEventsResponse.EVENTS_FIELD_NUMBER)
AGENT_EVENTS_TAG = field_key(pb.StreamSessionEventsResponse.AGENT_EVENTS_FIELD_NUMBER)
DROPPED_TAG = varint(pb.StreamSessionEventsResponse.DROPPED_AGENT_EVENTS_FIELD_NUMBER << 3)
"""The key of `dropped_agent_events` (a varint field: wire type 0)."""
_SHORT_HEADS = [EVENTS_TAG + bytes((size,)) for size in range(128)]
"""The tag and length of an event under 128 bytes (most of a turn's: its chunks), whose
length is one varint byte: built once, not per event."""


def response_bytes(
    events: Sequence[bytes], agent_events: Sequence[ae.AgentEvent], dropped: int
) -> bytes:
    """The wire form of `StreamSessionEventsResponse(events, agent_events, dropped)`.

    `events` are the events' wire bytes (`SessionLog.read_encoded`). The agent events
    are framed as the events are: serialized each, not copied into a response first.
    """
    parts: list[bytes] = []
    heads = _SHORT_HEADS
    for raw in events:
        size = len(raw)
        parts += (heads[size] if size < 128 else EVENTS_TAG + varint(size), raw)
    for event in agent_events:
        raw = event.SerializeToString()
        parts += (AGENT_EVENTS_TAG + varint(len(raw)), raw)
    if dropped:
        parts += (DROPPED_TAG, varint(dropped))
    return b"".join(parts)


def serialize(response: bytes | pb.StreamSessionEventsResponse) -> bytes:
    """Bytes as they are; a message serialized."""
    return response if isinstance(response, bytes) else response.SerializeToString()


class _Registrar:
    """Stands in for the method table while the generated code registers the service."""

    def __init__(self, table: MethodTable) -> None:
        self.table = table

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Dropped: `add_registered_method_handlers` gets the same methods."""

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        stream = handlers["StreamSessionEvents"]
        handlers = dict(
            handlers,
            StreamSessionEvents=grpc.unary_stream_rpc_method_handler(
                stream.unary_stream,
                request_deserializer=stream.request_deserializer,
                response_serializer=serialize,
            ),
        )
        self.table.add_registered_method_handlers(name, handlers)


def add_agent_service(servicer: rpc.AgentServiceServicer, table: MethodTable) -> None:
    """Register the AgentService as the generated code does, the stream writing bytes."""
    rpc.add_AgentServiceServicer_to_server(servicer, _Registrar(table))  # type: ignore[arg-type]
