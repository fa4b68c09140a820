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
from itertools import compress, repeat

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


_SUFFIXES = [b"%03d" % n for n in range(1000)]
"""A call id's last three digits, by its number's remainder of 1,000."""
_TAILS: dict[bytes, list[bytes]] = {}
"""Per head, a short event's head, payload key and length and notice event key and
length, by the event's length (`_tails`)."""
TAILS_KEPT = 1024
"""Heads (agents) `_TAILS` keeps (then it starts over)."""


def _tails(head: bytes) -> list[bytes]:
    tails = _TAILS.get(head)
    if tails is None:
        if len(_TAILS) >= TAILS_KEPT:
            _TAILS.clear()
        tails = _TAILS[head] = [head + notice for notice in _NOTICE_HEADS]
    return tails


def event_entries(head: bytes, events: Sequence[ev.SessionEvent], dropped: int = 0) -> list[bytes]:
    """`event_entry` of each of `events`, the first carrying `dropped`; one call for a run.

    The run's call ids are taken together (`CallIds.take`), its events serialized in one
    pass, and its entries made a thousand ids at a time (`_add_thousand`).
    """
    count = len(events)
    if not count:
        return []
    first = call_ids.take(count)
    encoded = list(map(_SERIALIZE, events))
    entries: list[bytes] = []
    start = 0
    if dropped:  # the first carries the drops
        entries.append(_entry(b"n%d" % first, head, encoded[0], dropped))
        start = 1
    sizes = list(map(len, encoded))
    tails = _tails(head)
    while start < count:
        end = min(count, start + 1000 - (first + start) % 1000)
        _add_thousand(entries, head, tails, first + start, encoded[start:end], sizes[start:end])
        start = end
    return entries


def _add_thousand(
    entries: list[bytes], head: bytes, tails: list[bytes], first: int,
    encoded: list[bytes], sizes: list[int],
) -> None:  # fmt: skip
    """Append the entries of `encoded`, their call ids numbered from `first`, in one thousand.

    The ids of one thousand (n1234000 to n1234999) are as long as each other and share
    all digits but the last three. A short event's entry (a chunk's, usually: every
    length inside one byte) is five parts joined, each fixed or looked up by the event's
    length, the id's last three digits from a table: all of it in C (`map`), no bytecode
    and no number formatted per event. A long event's entry, and those of ids under
    1,000, are built one by one.
    """
    thousand, low = divmod(first, 1000)
    if not thousand:  # ids of fewer digits: formatted
        for index, raw in enumerate(encoded):
            entries.append(_entry(b"n%d" % (first + index), head, raw, 0))
        return
    prefix = b"n%d" % thousand
    fixed = _SHORT_FIXED + len(head) + len(prefix) + 3
    limit = 0x80 - fixed  # an event shorter than this makes a short entry
    leads, key = _ENTRY_HEADS[fixed:], _ID_HEADS[len(prefix) + 3] + prefix
    start, join = 0, b"".join
    for cut in (*compress(range(len(sizes)), map(limit.__le__, sizes)), len(sizes)):
        if start < cut:  # the short ones before the long one
            shorts, suffixes = sizes[start:cut], _SUFFIXES[low + start : low + cut]
            entries += map(join, zip(
                map(leads.__getitem__, shorts), repeat(key), suffixes,
                map(tails.__getitem__, shorts), encoded[start:cut],
            ))  # fmt: skip
        if cut < len(sizes):
            entries.append(_entry(prefix + _SUFFIXES[low + cut], head, encoded[cut], 0))
        start = cut + 1


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
