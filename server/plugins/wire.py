"""`HandleRequest`s as bytes: each call serialized once, notifications framed into batches.

The server writes the plugin stream as bytes (its serializer is the identity), so a
call is encoded once and its size known without a second pass (`ByteSize` encodes
too), and a batch of calls is the concatenation of their encodings with a
field header each: no copy of a message into another.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentloop.plugin.transport import field_key, framed, varint
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import content_pb2 as c

HANDLE_METHOD = "/agentloop.plugin.v1.HookService/Handle"
"""The full name of the `Handle` method."""

BATCH_CAPABILITY = "call_batch"
"""The capability a plugin lists to take several calls in one message (`CallBatch`)."""

_CALL = field_key(hk.HandleRequest.CALL_FIELD_NUMBER)
_BATCH = field_key(hk.HandleRequest.BATCH_FIELD_NUMBER)
_BATCH_CALL = field_key(hk.CallBatch.CALLS_FIELD_NUMBER)


def call_request(call: bytes) -> bytes:
    """`HandleRequest(call=...)` from the serialized `HookCall`."""
    return framed(_CALL, call)


def batch_entry(call: bytes) -> bytes:
    """One `CallBatch.calls` entry from the serialized `HookCall`.

    Both fields are number 1: an entry is also the `HandleRequest` of the call alone.
    """
    return framed(_BATCH_CALL, call)


assert _BATCH_CALL == _CALL, "CallBatch.calls and HandleRequest.call share their framing"


def batch_request(entries: list[bytes]) -> bytes:
    """`HandleRequest(batch=CallBatch(calls=...))` from `batch_entry`s."""
    return framed(_BATCH, b"".join(entries))


_MODEL_STREAM = field_key(hk.HookCall.MODEL_STREAM_FIELD_NUMBER)
_MESSAGE = field_key(hk.ModelStreamCall.MESSAGES_FIELD_NUMBER)


def message_entry(message: c.Message) -> bytes:
    """One `ModelStreamCall.messages` entry: the field as the call's encoding holds it."""
    return framed(_MESSAGE, message.SerializeToString())


def model_stream_request(call: hk.HookCall, messages: Sequence[bytes | bytearray]) -> bytes:
    """`call_request` of `call` with `messages` (`message_entry`s) as its model's messages.

    The call's `model_stream` holds no messages of its own: they come encoded, from a
    provider's kept history (`server.plugins.model`). The bytes are those of the call
    with the messages set, serialized: fields in number order, the model stream after
    the call's lower fields and before its trace context (its only higher fields, but
    for other payloads), the messages last in the model stream (its highest field).
    """
    stream = call.model_stream.SerializeToString()
    whole = call.SerializeToString()
    after = hk.HookCall(traceparent=call.traceparent, tracestate=call.tracestate)
    tail = after.SerializeToString()
    before = len(whole) - len(tail) - len(_MODEL_STREAM) - len(varint(len(stream))) - len(stream)
    inner = len(stream) + sum(len(m) for m in messages)
    head = varint(inner)
    size = before + len(_MODEL_STREAM) + len(head) + inner + len(tail)
    return b"".join(
        (_CALL, varint(size), whole[:before], _MODEL_STREAM, head, stream, *messages, tail)
    )


_STREAM_NUMBER = hk.HookCall.MODEL_STREAM_FIELD_NUMBER
_HIGHER = {  # the other payloads are never set with model_stream
    f.name
    for f in hk.HookCall.DESCRIPTOR.fields
    if f.number > _STREAM_NUMBER and f.containing_oneof is None
}
assert {"traceparent", "tracestate"} == _HIGHER, "model_stream_request: the fields after it"
_LAST = max(f.number for f in hk.ModelStreamCall.DESCRIPTOR.fields)
assert _LAST == hk.ModelStreamCall.MESSAGES_FIELD_NUMBER, "model_stream_request: messages last"


BATCH_OVERHEAD = 1 + 10
"""The most a batch's own field header adds to its entries (key byte, length varint)."""


def cancel_request(call_id: str, reason: str) -> bytes:
    """`HandleRequest(cancel=CancelCall(...))`."""
    return hk.HandleRequest(
        cancel=hk.CancelCall(call_id=call_id, reason=reason)
    ).SerializeToString()
