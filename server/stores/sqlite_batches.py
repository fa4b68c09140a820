"""A run of one session's events in one row of the SQLite store (format 4).

A commit writes the events it carries for a session as one row keyed by the first
one's seq, not one row each: a turn of 24 events is two or three rows. The row count,
the key (the session id, repeated in every row) and the B-tree work per commit
shrink with it, and so do the pages a commit rewrites.

A row holds `count` events. One event is stored as its own bytes (so a row of format
3 reads as it is); several as the wire form of a protobuf `repeated SessionEvent`
field number 1: for each event the tag byte 0x0A, its length as a varint, its bytes.
`kinds` has the bit `1 << kind` set for every payload kind in the row (kinds are
payload field numbers, all below 64), so a query finds the last row with a
`turn_start` or a `turn_end` without decoding, then decodes that row alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from agentloop.plugin.transport import field_key, varint

TAG = field_key(1)
"""Field 1, length-delimited (0x0A)."""


def pack(raws: Sequence[bytes]) -> bytes:
    """The bytes of a row holding `raws` (serialized events, in seq order)."""
    if len(raws) == 1:
        return raws[0]
    parts: list[bytes] = []
    for raw in raws:
        parts += (TAG, varint(len(raw)), raw)
    return b"".join(parts)


def unpack(blob: bytes, count: int) -> list[bytes]:
    """The serialized events of a row of `count` events; `DecodeError` if it is not one."""
    if count == 1:
        return [blob]
    raws = []
    at, end = 0, len(blob)
    while at < end:
        if blob[at] != TAG[0]:
            raise DecodeError(f"a row of {count} events has a bad tag at byte {at}")
        at += 1
        n = shift = 0
        while True:
            if at >= end or shift > 63:
                raise DecodeError(f"a row of {count} events has a bad length at byte {at}")
            byte = blob[at]
            at += 1
            n |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        if at + n > end:
            raise DecodeError(f"a row of {count} events ends inside an event")
        raws.append(blob[at : at + n])
        at += n
    if len(raws) != count:
        raise DecodeError(f"a row of {count} events holds {len(raws)}")
    return raws


def kinds_of(kinds: Sequence[int]) -> int:
    """The `kinds` bits of a row whose events have these payload kinds."""
    bits = 0
    for kind in kinds:
        bits |= 1 << kind
    return bits
