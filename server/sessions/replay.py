"""Where a resume replays a stored log from: its last compaction, not its first event.

A compaction's summary stands for every history node before its kept part, and it
carries the request header in force (`Compaction.header`): the history, the header
and the turn numbering of the whole log follow from the events after the replaced
range (`last_seq`) on, and from the last turn boundary on (a crash's repair, the open
turn). So a load reads the log backwards, a slice at a time, until it holds both,
and no further: its cost is that of the log since the last compaction, not of the
whole log. A log without such a compaction is read whole. The full log stays in the
store for readers (`ListSessionEvents`) and forks.
"""

from __future__ import annotations

from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import SessionDamaged
from server.stores import FIRST_SEQ, SessionStore, check_count

SLICE = 2048
"""Events read in one go, walking back from the end of the log."""

BOUNDARIES = frozenset({"turn_start", "turn_end"})


def replay_point(event: ev.SessionEvent) -> int:
    """The first seq a replay needs if it holds `event`'s compaction; 0 if it is none."""
    if event.WhichOneof("payload") != "context_message":
        return 0
    compaction = event.context_message.compaction
    if event.surface_op.kind != ev.SURFACE_OP_KIND_REPLACE or not compaction.HasField("header"):
        return 0  # recorded without its header: the older events still count
    return compaction.last_seq + 1


async def replay_tail(store: SessionStore, session_id: str, count: int) -> list[ev.SessionEvent]:
    """The stored events of the first `count` a replay of the log needs, in order.

    They start at the last compaction's kept part, or earlier at the last turn
    boundary when the last turn began before it; at the first event when no
    compaction is a replay point.
    """
    slices: list[list[ev.SessionEvent]] = []
    boundary = 0
    point = 0
    end = FIRST_SEQ + count
    while end > FIRST_SEQ:
        start = max(FIRST_SEQ, end - SLICE)
        chunk = await store.read(session_id, start, end)
        if len(chunk) != end - start:
            last = chunk[-1].seq if chunk else start - 1
            if end == FIRST_SEQ + count and len(chunk) == last - start + 1:
                check_count(session_id, count, last - FIRST_SEQ + 1)  # the tail cut: says so
            raise SessionDamaged(session_id, f"events {start}..{end - 1} are not all stored")
        slices.append(chunk)
        for event in reversed(chunk):
            if not boundary and event.WhichOneof("payload") in BOUNDARIES:
                boundary = event.seq
            if not point:
                point = replay_point(event)
        end = start
        if point and boundary and end <= min(point, boundary):
            first = min(point, boundary)
            tail = [event for part in reversed(slices) for event in part]
            return tail[first - end :]
    return [event for part in reversed(slices) for event in part]
