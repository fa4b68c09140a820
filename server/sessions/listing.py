"""Listing sessions with filters: agent, live, creation time, last end, id text.

A filtered page examines a bounded number of sessions (`SCAN_PER_PAGE`), so a call
costs the same whatever the filter matches: a page may come back short, or empty, with
a cursor to go on from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.sessions.catalogue import SessionCatalogue

END_REASONS = frozenset(
    f.name for f in ev.TurnEndReason.DESCRIPTOR.oneofs_by_name["kind"].fields
) | {"none"}
"""The words of the `end_reason` filter: each kind of `TurnEndReason`, and "none"."""

SCAN_PER_PAGE = 10
"""A filtered page examines at most this many sessions per session of its size."""

TAIL_CHUNK = 64
"""Events read at a time, backwards, while looking for a session's last `turn_end`."""


@dataclass(frozen=True)
class SessionFilter:
    """Which sessions a listing keeps; the defaults keep every one."""

    agent_id: str = ""
    live: bool | None = None
    created_after_ns: int | None = None
    created_before_ns: int | None = None
    end_reason: str = ""
    id_contains: str = ""

    def describes(self) -> str:
        """The filter as text: page tokens are bound to it."""
        return repr(self)


@dataclass
class Listed:
    """One page of a listing."""

    sessions: list[session_pb2.Session] = field(default_factory=list)
    last_examined: str = ""
    """The last id looked at; the next page starts after it."""
    more: bool = False
    """Whether ids remain after `last_examined`."""


async def list_sessions(
    catalogue: SessionCatalogue, keep: SessionFilter, after: str | None, size: int
) -> Listed:
    """A page of at most `size` sessions after the id `after`, in id order, as `keep` says.

    Each listed session carries `last_end_reason` and `update_time`.
    """
    ids = await candidates(catalogue, keep)
    ids = [i for i in ids if after is None or i > after]
    budget = size * SCAN_PER_PAGE
    page = Listed()
    for index, session_id in enumerate(ids):
        if len(page.sessions) == size or index == budget:
            page.more = True
            return page
        page.last_examined = session_id
        session = await catalogue.describe(session_id)
        if not _header_matches(keep, session):
            continue
        await _add_tail(catalogue, session)
        if keep.end_reason and (session.last_end_reason or "none") != keep.end_reason:
            continue
        page.sessions.append(session)
    return page


async def candidates(catalogue: SessionCatalogue, keep: SessionFilter) -> list[str]:
    """The ids a listing looks at, sorted: every session, or those of one agent."""
    if keep.agent_id:
        ids = {i for i, s in catalogue.live.items() if s.agent_id == keep.agent_id}
        ids |= set(await catalogue.store.driven_by(keep.agent_id))
    else:
        ids = set(await catalogue.session_ids())
    if keep.live is True:
        ids &= set(catalogue.live)
    elif keep.live is False:
        ids -= set(catalogue.live)
    if keep.id_contains:
        needle = keep.id_contains.casefold()
        ids = {i for i in ids if needle in i.casefold()}
    return sorted(ids)


def _header_matches(keep: SessionFilter, session: session_pb2.Session) -> bool:
    created = session.header.create_time.ToNanoseconds()
    if keep.created_after_ns is not None and created < keep.created_after_ns:
        return False
    return keep.created_before_ns is None or created < keep.created_before_ns


async def _add_tail(catalogue: SessionCatalogue, session: session_pb2.Session) -> None:
    """Set `update_time` (the last event's) and `last_end_reason` (the last `turn_end`'s)."""
    count = session.event_count
    if not count or session.load_error:
        return
    end = count + 1  # seqs run 1..count
    while end > 1:
        start = max(1, end - TAIL_CHUNK)
        events = await _read(catalogue, session.session_id, start, end)
        if not events:
            return
        if end == count + 1:
            session.update_time.CopyFrom(events[-1].create_time)
        for event in reversed(events):
            if event.HasField("turn_end"):
                session.last_end_reason = event.turn_end.reason.WhichOneof("kind") or ""
                return
        end = start


async def _read(
    catalogue: SessionCatalogue, session_id: str, start: int, end: int
) -> list[ev.SessionEvent]:
    live = catalogue.live.get(session_id)
    if live is not None:
        return await live.read(start, end - start)
    return await catalogue.store.read(session_id, start, end)
