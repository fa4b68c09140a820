"""A session-event notification encoded straight from its parts, once, when it is queued.

An observer of session events is sent every event, chunks included: tens of thousands
in a long turn. Building each as a `HookCall` (its fields set one by one, the event
copied in) and serializing it later costs more than the event itself did, and so did
holding it as an object until the writer encoded it. `event_entry` writes the call's
bytes, framed as a batch entry, in one pass from the event and the call's fixed fields
already encoded (`event_head`: seam, agent, session and kind, the same for every
notification of one subscription and agent): the same bytes, field for field, as the
`HookCall` serialized. The queue holds those bytes; the writer only joins them.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from agentloop.plugin.transport import field_key, varint
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import session_event_pb2 as ev
from server.plugins.calls import call_ids

_CALL_ID = field_key(hk.HookCall.CALL_ID_FIELD_NUMBER)
_SESSION_EVENT = field_key(hk.HookCall.SESSION_EVENT_FIELD_NUMBER)
_EVENT = field_key(hk.SessionEventNotice.EVENT_FIELD_NUMBER)
_ENTRY = field_key(hk.CallBatch.CALLS_FIELD_NUMBER)  # also `HandleRequest.call`: both 1
_ONE = [bytes((n,)) for n in range(0x80)]
"""The varints of 0 to 127: one byte each."""
_DROPPED = varint(hk.SessionEventNotice.DROPPED_FIELD_NUMBER << 3)  # a varint field
_EVENT_KEY = len(_EVENT) + 1
"""The notice's bytes besides a short event's: its key and a one-byte length."""
_SHORT = 0x80 - _EVENT_KEY
"""An event shorter than this makes a notice whose length is one byte too."""
_SHORT_FIXED = 2 + len(_SESSION_EVENT) + 1 + _EVENT_KEY
"""A short event's call besides its id, head and event: the id's key and length, the
payload's key and length, the notice's own."""

_HEAD = {f.name: f.number for f in hk.HookCall.DESCRIPTOR.fields}
assert _HEAD["call_id"] < min(_HEAD["seam"], _HEAD["agent_id"], _HEAD["session_id"]), (
    "event_entry: the call id goes before the head's fields"
)
assert _HEAD["session_event"] > max(_HEAD["kind"], _HEAD["session_id"]), (
    "event_entry: the payload goes after the head's fields"
)


def event_head(seam: hk.Seam.ValueType, agent_id: str, session_id: str) -> bytes:
    """The fixed fields of a session-event notification, encoded (all but id and payload)."""
    call = hk.HookCall(
        kind=hk.CALL_KIND_NOTIFICATION, seam=seam, agent_id=agent_id, session_id=session_id
    )
    return call.SerializeToString()


def event_entry(head: bytes, event: ev.SessionEvent, dropped: int = 0) -> bytes:
    """The notification of `event` as a `CallBatch` entry, with a fresh call id.

    The entry is `wire.batch_entry` of the call's bytes; the call carries `dropped`.
    Sizes are summed, not measured on parts joined one by one: one join per event,
    and a varint under 128 is a table look-up, not a call.
    """
    call_id = b"n%d" % next(call_ids)
    encoded = event.SerializeToString()
    n = len(encoded)
    if n < _SHORT and not dropped:  # a chunk's, usually: every length inside is one byte
        call = _SHORT_FIXED + len(call_id) + len(head) + n
        call_size = _ONE[call] if call < 0x80 else varint(call)
        return b"".join(
            (_ENTRY, call_size, _CALL_ID, _ONE[len(call_id)], call_id, head,
             _SESSION_EVENT, _ONE[n + _EVENT_KEY], _EVENT, _ONE[n], encoded)
        )  # fmt: skip
    return _entry(call_id, head, encoded, dropped)


_SERIALIZE = ev.SessionEvent.SerializeToString

_ENTRY_HEADS = [_ENTRY + one for one in _ONE]
"""A short call's entry key and length, by the call's length."""
_ID_HEADS = [_CALL_ID + one for one in _ONE]
"""The call id's key and length, by the id's length."""
_NOTICE_HEADS = [_SESSION_EVENT + _ONE[n + _EVENT_KEY] + _EVENT + _ONE[n] for n in range(_SHORT)]
"""A short event's payload key and length, the notice's event key and length, by the
event's length."""


def event_entries(head: bytes, events: Sequence[ev.SessionEvent], dropped: int = 0) -> list[bytes]:
    """`event_entry` of each of `events`, the first carrying `dropped`; one call for a run.

    The call ids are taken together and formatted in one pass; a short event's entry is
    four fixed parts looked up by length around its id and its bytes.
    """
    count = len(events)
    if not count:
        return []
    ids = (b"n%d " * count % tuple(islice(call_ids, count))).split()
    entries: list[bytes] = []
    append, join = entries.append, b"".join
    fixed = _SHORT_FIXED + len(head)
    for call_id, encoded in zip(ids, map(_SERIALIZE, events), strict=True):
        n = len(encoded)
        if n < _SHORT and not dropped:
            call = fixed + len(call_id) + n
            if call < 0x80:
                heads = (_ENTRY_HEADS[call], _ID_HEADS[len(call_id)], call_id, head)
                append(join((*heads, _NOTICE_HEADS[n], encoded)))
                continue
        append(_entry(call_id, head, encoded, dropped))
        dropped = 0
    return entries


def _entry(call_id: bytes, head: bytes, encoded: bytes, dropped: int) -> bytes:
    """`event_entry` of an event already encoded, with its call id (any length)."""
    n = len(encoded)
    event_size = _ONE[n] if n < 0x80 else varint(n)
    notice = len(_EVENT) + len(event_size) + n
    counted = _DROPPED + varint(dropped) if dropped else b""
    notice += len(counted)
    notice_size = _ONE[notice] if notice < 0x80 else varint(notice)
    call = 2 + len(call_id) + len(head) + len(_SESSION_EVENT) + len(notice_size) + notice
    call_size = _ONE[call] if call < 0x80 else varint(call)
    return b"".join(
        (_ENTRY, call_size, _CALL_ID, _ONE[len(call_id)], call_id, head,
         _SESSION_EVENT, notice_size, _EVENT, event_size, encoded, counted)
    )  # fmt: skip


def event_call(head: bytes, event: ev.SessionEvent, dropped: int = 0) -> hk.HookCall:
    """The notification as a message (for a reader that wants one, not bytes)."""
    return hk.HandleRequest.FromString(event_entry(head, event, dropped)).call
