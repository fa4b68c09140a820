"""`HandleRequest`s as bytes: each call serialized once, notifications framed into batches.

The server writes the plugin stream as bytes (its serializer is the identity), so a
call is encoded once and its size known without a second pass (`ByteSize` encodes
too), and a batch of calls is the concatenation of their encodings with a
field header each: no copy of a message into another.
"""

from __future__ import annotations

from agentloop.plugin.v1 import hook_service_pb2 as hk

HANDLE_METHOD = "/agentloop.plugin.v1.HookService/Handle"
"""The full name of the `Handle` method."""

BATCH_CAPABILITY = "call_batch"
"""The capability a plugin lists to take several calls in one message (`CallBatch`)."""

_LENGTH_DELIMITED = 2


def _key(field: int) -> bytes:
    return varint((field << 3) | _LENGTH_DELIMITED)


def varint(value: int) -> bytes:
    """`value` (≥ 0) as a protobuf base-128 varint."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_CALL = _key(hk.HandleRequest.CALL_FIELD_NUMBER)
_BATCH = _key(hk.HandleRequest.BATCH_FIELD_NUMBER)
_BATCH_CALL = _key(hk.CallBatch.CALLS_FIELD_NUMBER)


def framed(key: bytes, payload: bytes) -> bytes:
    """A length-delimited field: key, length, payload."""
    return b"".join((key, varint(len(payload)), payload))


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


BATCH_OVERHEAD = 1 + 10
"""The most a batch's own field header adds to its entries (key byte, length varint)."""


def cancel_request(call_id: str, reason: str) -> bytes:
    """`HandleRequest(cancel=CancelCall(...))`."""
    return hk.HandleRequest(
        cancel=hk.CancelCall(call_id=call_id, reason=reason)
    ).SerializeToString()
