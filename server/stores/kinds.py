"""Payload kinds as stored: each `SessionEvent` payload's field number.

Stores keep the kind of each event beside its bytes, so that a query (a fork's
boundary, a session's last turn) needs no decoding.
"""

from __future__ import annotations

from agentloop.v1 import session_event_pb2 as ev

_PAYLOAD = ev.SessionEvent.DESCRIPTOR.oneofs_by_name["payload"]
KIND_NUMBERS = {f.name: f.number for f in _PAYLOAD.fields}
"""Each payload kind and its field number: what a `kind` column holds."""
KIND_NAMES = {number: name for name, number in KIND_NUMBERS.items()}
TURN_START = KIND_NUMBERS["turn_start"]
TURN_END = KIND_NUMBERS["turn_end"]


def kind_number(event: ev.SessionEvent) -> int:
    """The field number of the event's payload (its kind, as stored)."""
    return KIND_NUMBERS[event.WhichOneof("payload") or "turn_end"]
