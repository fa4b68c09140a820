"""A session-event notification encoded from its parts is the call `fill` makes."""

from __future__ import annotations

import pytest

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.plugins import event_notes
from server.plugins.calls import CallIds, NoticeSlot, PluginStats
from server.plugins.event_notes import event_call, event_entries, event_entry, event_head
from server.plugins.notice_queue import NoticeQueue
from server.plugins.wire import BATCH_OVERHEAD, batch_entry

EVENT = ev.SessionEvent(
    seq=41,
    assistant_chunk=ev.AssistantChunk(
        turn=3, step=2, chunk=st.StreamChunk(block_delta=st.BlockDelta(index=0))
    ),
)
EVENT.create_time.FromNanoseconds(1_700_000_000_123_456_789)
EVENT.assistant_chunk.chunk.block_delta.text = "é" * 200  # a length past one byte


SHORT = ev.SessionEvent(
    seq=7, assistant_chunk=ev.AssistantChunk(turn=1, step=1, chunk=st.StreamChunk())
)
SHORT.assistant_chunk.chunk.block_delta.text = "x"  # a chunk's: every length one byte


def built(call_id: str, dropped: int, event: ev.SessionEvent = EVENT) -> hk.HookCall:
    """The notification as a `HookCall` made field by field (the codecs' way)."""
    call = hk.HookCall(
        call_id=call_id,
        kind=hk.CALL_KIND_NOTIFICATION,
        seam=hk.SEAM_SESSION_EVENTS,
        agent_id="agent-1",
        session_id="agent-1-session",
    )
    call.session_event.event.CopyFrom(event)
    call.session_event.dropped = dropped
    return call


def test_the_encoded_note_is_the_calls_bytes_field_for_field() -> None:
    head = event_head(hk.SEAM_SESSION_EVENTS, "agent-1", "agent-1-session")
    for event in (EVENT, SHORT):
        for dropped in (0, 1, 300):
            entry = event_entry(head, event, dropped)
            call = hk.HandleRequest.FromString(entry).call  # an entry alone is a HandleRequest
            assert call.call_id.startswith("n")
            assert call == built(call.call_id, dropped, event)
            expected = built(call.call_id, dropped, event).SerializeToString(deterministic=True)
            assert entry == batch_entry(expected)


def test_a_large_event_is_framed_with_longer_lengths() -> None:
    big = ev.SessionEvent()
    big.CopyFrom(EVENT)
    big.assistant_chunk.chunk.block_delta.text = "x" * 20_000  # lengths of three bytes
    call = event_call(event_head(hk.SEAM_SESSION_EVENTS, "a", "s"), big)
    assert call.session_event.event == big


def test_each_encoding_gets_a_fresh_notification_id() -> None:
    head = event_head(hk.SEAM_SESSION_EVENTS, "a", "s")
    assert event_call(head, EVENT).call_id != event_call(head, EVENT).call_id


def test_a_run_is_encoded_as_its_events_one_by_one() -> None:
    """`event_entries`: the same bytes as `event_entry` per event, ids in order, the
    first alone carrying the drops."""
    big = ev.SessionEvent()
    big.CopyFrom(EVENT)
    big.assistant_chunk.chunk.block_delta.text = "x" * 20_000
    run = [SHORT, EVENT, SHORT, big, SHORT]
    head = event_head(hk.SEAM_SESSION_EVENTS, "agent-1", "agent-1-session")
    for dropped in (0, 5):
        entries = event_entries(head, run, dropped)
        calls = [hk.HandleRequest.FromString(entry).call for entry in entries]
        ids = [int(call.call_id[1:]) for call in calls]
        assert ids == list(range(ids[0], ids[0] + len(run)))
        for index, (entry, call, event) in enumerate(zip(entries, calls, run, strict=True)):
            expected = built(call.call_id, dropped if index == 0 else 0, event)
            assert entry == batch_entry(expected.SerializeToString(deterministic=True))
    assert event_entries(head, []) == []


async def test_a_run_offered_takes_the_room_left_and_the_rest_is_counted_and_carried() -> None:
    """`NoticeQueue.offer_events`: the drops before a run ride on its first notification;
    those past the slot's room are dropped, and the next notification carries them."""
    stats = PluginStats()
    queue = NoticeQueue(stats, 1 << 20)
    slot = NoticeSlot(limit=3)
    head = event_head(hk.SEAM_SESSION_EVENTS, "agent-1", "agent-1-session")
    queue.offer_events(head, [], slot)  # a run its conditions excluded: nothing
    assert (stats.dropped, slot.queued) == (0, 0)
    queue.offer_events(head, [SHORT] * 2, slot)  # not READY: both dropped
    assert (stats.dropped, slot.queued) == (2, 0)
    queue.ready = True
    queue.offer_events(head, [SHORT] * 5, slot)  # room for 3: 2 more dropped
    assert (stats.dropped, slot.queued) == (4, 3)
    first = queue._take_notes(1 << 20)
    assert [hk.HandleRequest.FromString(e).call.session_event.dropped for e in first] == [2, 0, 0]
    queue.offer_events(head, [EVENT], slot)
    (entry,) = queue._take_notes(1 << 20)
    assert hk.HandleRequest.FromString(entry).call.session_event.dropped == 2
    assert slot.queued == 0 and stats.dropped == 4


@pytest.mark.parametrize("first", [1, 990, 1_000, 1_995, 999_990])
def test_a_run_across_a_thousand_of_ids_is_its_events_one_by_one(
    first: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short entries are made a thousand ids at a time (`_add_thousand`): a run whose ids
    start below 1,000, cross into the next thousand or gain a digit, with long events
    among its short ones, has the bytes of `event_entry` per event, ids in order."""
    ids = CallIds(first)
    monkeypatch.setattr(event_notes, "call_ids", ids)
    big = ev.SessionEvent()
    big.CopyFrom(EVENT)
    big.assistant_chunk.chunk.block_delta.text = "x" * 300
    run = [SHORT] * 4 + [big] + [SHORT] * 6 + [EVENT, big] + [SHORT] * 8
    head = event_head(hk.SEAM_SESSION_EVENTS, "agent-1", "agent-1-session")
    for dropped in (0, 3):
        start = ids.take(0)
        entries = event_entries(head, run, dropped)
        assert len(entries) == len(run)
        for index, (entry, event) in enumerate(zip(entries, run, strict=True)):
            expected = built(f"n{start + index}", dropped if index == 0 else 0, event)
            assert entry == batch_entry(expected.SerializeToString(deterministic=True))


def test_call_ids_taken_as_a_run_are_not_taken_again() -> None:
    ids = CallIds(7)
    assert next(ids) == 7
    assert ids.take(5) == 8
    assert next(ids) == 13


def test_a_run_longer_than_a_message_is_sent_in_order_across_messages() -> None:
    """A run stays one item in the queue; a message takes what fits of it, the next
    one the rest, and a stream ending drops (and counts) what was left."""
    stats = PluginStats()
    queue = NoticeQueue(stats, 1 << 20)
    queue.ready = True
    slot = NoticeSlot(limit=100)
    head = event_head(hk.SEAM_SESSION_EVENTS, "agent-1", "agent-1-session")
    run = [ev.SessionEvent(seq=n, assistant_chunk=SHORT.assistant_chunk) for n in range(10)]
    queue.offer_events(head, run[:1], slot)  # a run of one
    queue.offer_events(head, run[1:], slot)
    size = len(event_entry(head, SHORT))
    taken = queue._take_notes(BATCH_OVERHEAD + 4 * size)  # four fit
    assert len(taken) == 4 and slot.queued == 6
    taken += queue._take_notes(1 << 20, most=3)  # a plugin taking fewer at a time
    assert slot.queued == 3
    seqs = [hk.HandleRequest.FromString(e).call.session_event.event.seq for e in taken]
    assert seqs == list(range(7))
    queue.clear()
    assert (slot.queued, stats.dropped) == (0, 3)
    queue.offer_events(head, run[:1], slot)
    (entry,) = queue._take_notes(1 << 20)
    assert hk.HandleRequest.FromString(entry).call.session_event.dropped == 3
