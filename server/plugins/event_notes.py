"""A session-event notification held as its parts and encoded once, when it is written.

An observer of session events is sent every event, chunks included: tens of thousands
in a long turn. Building each as a `HookCall` (its fields set one by one, the event
copied in) and serializing it later costs more than the event itself did. An
`EventNote` is the event and the call's fixed fields already encoded (`head`: seam,
agent, session and kind, the same for every notification of one subscription and
agent); `encode` writes the call's bytes in one pass: the same bytes, field for field,
as the `HookCall` serialized.
"""

from __future__ import annotations

from agentloop.plugin.transport import field_key, varint
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import session_event_pb2 as ev
from server.plugins.calls import call_ids

_CALL_ID = field_key(hk.HookCall.CALL_ID_FIELD_NUMBER)
_SESSION_EVENT = field_key(hk.HookCall.SESSION_EVENT_FIELD_NUMBER)
_EVENT = field_key(hk.SessionEventNotice.EVENT_FIELD_NUMBER)
_ENTRY = field_key(hk.CallBatch.CALLS_FIELD_NUMBER)  # also `HandleRequest.call`: both 1
_DROPPED = varint(hk.SessionEventNotice.DROPPED_FIELD_NUMBER << 3)  # a varint field

_HEAD = {f.name: f.number for f in hk.HookCall.DESCRIPTOR.fields}
assert _HEAD["call_id"] < min(_HEAD["seam"], _HEAD["agent_id"], _HEAD["session_id"]), (
    "EventNote.encode: the call id goes before the head's fields"
)
assert _HEAD["session_event"] > max(_HEAD["kind"], _HEAD["session_id"]), (
    "EventNote.encode: the payload goes after the head's fields"
)


def event_head(seam: hk.Seam.ValueType, agent_id: str, session_id: str) -> bytes:
    """The fixed fields of a session-event notification, encoded (all but id and payload)."""
    call = hk.HookCall(
        kind=hk.CALL_KIND_NOTIFICATION, seam=seam, agent_id=agent_id, session_id=session_id
    )
    return call.SerializeToString()


class EventNote:
    """A session-event notification, not yet encoded: its head, its event, its drop count."""

    __slots__ = ("head", "event", "dropped")

    def __init__(self, head: bytes, event: ev.SessionEvent) -> None:
        self.head = head
        self.event = event
        self.dropped = 0
        """Notifications dropped before this one (set when it is queued)."""

    def encode(self) -> bytes:
        """The `HookCall`'s bytes, with a fresh notification id."""
        call_id = f"n{next(call_ids)}".encode()
        event = self.event.SerializeToString()
        notice = b"".join((_EVENT, varint(len(event)), event))
        if self.dropped:
            notice += _DROPPED + varint(self.dropped)
        return b"".join(
            (_CALL_ID, varint(len(call_id)), call_id, self.head,
             _SESSION_EVENT, varint(len(notice)), notice)
        )  # fmt: skip

    def entry(self) -> bytes:
        """`wire.batch_entry` of `encode()`, framed here: one call less per event."""
        call = self.encode()
        return b"".join((_ENTRY, varint(len(call)), call))

    def call(self) -> hk.HookCall:
        """The notification as a message (for a reader that wants one, not bytes)."""
        return hk.HookCall.FromString(self.encode())
