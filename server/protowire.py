"""Protobuf wire-format primitives, for the messages the server writes as bytes.

Where the server frames bytes it already holds (events serialized once, plugin calls
encoded once) instead of copying them into a message to serialize it again: a
stream's responses, a plugin's calls and batches, a SQLite row of several events.
"""

from __future__ import annotations

LENGTH_DELIMITED = 2
"""The wire type of bytes, strings and messages."""

_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def varint(value: int) -> bytes:
    """`value` (≥ 0) as a base-128 varint."""
    if value < 0x80:  # most lengths of events and calls: a table look-up
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_key(number: int) -> bytes:
    """The key of a length-delimited field `number`."""
    return varint((number << 3) | LENGTH_DELIMITED)


def framed(key: bytes, payload: bytes) -> bytes:
    """A length-delimited field: key, length, payload."""
    return b"".join((key, varint(len(payload)), payload))
