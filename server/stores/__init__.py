"""Session stores: the log of record.

A store keeps, per session, its header, its events (in sequence order, each stored
once as the protobuf message of the contract) and its durable inbox (accepted
messages that no turn has recorded yet); and, per agent id, the answers of calls
made with a `request_id`. Everything one group commit writes (`Commit`) lands in
one transaction: after a crash a commit is either whole or absent.

Sequence numbers start at `FIRST_SEQ` (1) and have no gaps, so a session with n
stored events holds seqs 1..n; the store keeps n beside the log, so a log that lost
its last rows loads as damaged (`check_count`), not as a turn a crash cut short.
Writes are fenced twice. A session's events in a commit must start exactly at the
next sequence number (stored count + 1), so two writers can never interleave events.
And whoever drives a session claims it first (`claim` returns a new token); every
later commit of the driver carries that token, and a commit with an older one (a
process that was paused or partitioned while another took the session over) is
refused with `StoreConflict`, even where its sequence numbers would fit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import AgentLoopError, InvalidArgument, SessionDamaged, Unavailable

FIRST_SEQ = 1
"""The sequence number of a session's first event (0 never names an event)."""

INBOX_MESSAGE = "message"
INBOX_STEERING = "steering"
INBOX_CONTEXT = "context"


class StoreConflict(AgentLoopError):
    """An append did not follow the stored log: another writer got there first."""

    reason = "STORE_CONFLICT"


class StoreUnavailable(Unavailable):
    """The store cannot be reached now (an outage); the call may be retried."""

    reason = "STORE_UNAVAILABLE"


@dataclass(frozen=True)
class InboxEntry:
    """An accepted message waiting in a session's durable inbox.

    `message` is a `UserMessage` (kind message or steering) or a `ContextMessage`
    (kind context), carrying content, source and request id.
    """

    entry_id: int
    kind: str
    message: ev.UserMessage | ev.ContextMessage


@dataclass(frozen=True)
class RequestRecord:
    """The first answer to a call made with a request id."""

    agent_id: str
    request_id: str
    method: str
    response: bytes
    stored_ns: int = field(default=0, compare=False)
    """When it was stored (ns since the epoch; a PostgreSQL store keeps microseconds).
    Written as 0, it is stored as now; an import or a move writes the original's."""


Answer = Callable[[int], RequestRecord]
"""The request record of a delete, made from the number of events it removed."""


@dataclass
class SessionWrites:
    """What one commit writes for one session."""

    create: session_pb2.SessionHeader | None = None
    """Create the session with this header first (its first events may follow)."""
    driver: str = ""
    """The agent now driving the session (recorded so its pending work can follow it)."""
    options: agent_pb2.AgentOptions | None = None
    """The options of that agent: a resume without options restores them."""
    events: list[ev.SessionEvent] = field(default_factory=list)
    """New events; the first one's seq must be the stored event count + 1."""
    inbox_put: list[InboxEntry] = field(default_factory=list)
    inbox_take: list[int] = field(default_factory=list)
    """Entry ids recorded by an event of this commit (or dropped), removed."""
    requests: list[RequestRecord] = field(default_factory=list)
    """First answers of calls with a request id that wrote to this session."""
    fence: int = 0
    """The writer's claim token (see `SessionStore.claim`); 0 writes unfenced."""
    encode: Callable[[ev.SessionEvent], bytes] = field(
        default=lambda event: event.SerializeToString(), repr=False, compare=False
    )
    """An event's wire bytes: the session's own, serialized once for its streams too."""

    def empty(self) -> bool:
        """Whether there is nothing to write."""
        return not (
            self.create is not None
            or self.driver
            or self.options is not None
            or self.events
            or self.inbox_put
            or self.inbox_take
            or self.requests
        )


@dataclass
class Commit:
    """Everything one group commit writes, in one transaction."""

    sessions: dict[str, SessionWrites] = field(default_factory=dict)
    unsure: str = field(default="", compare=False)
    """A store's mark of an earlier attempt of this commit whose outcome it could not
    learn (the connection broke around its end); the store checks it before retrying."""

    def of(self, session_id: str) -> SessionWrites:
        """The writes of `session_id` in this commit (created on first use)."""
        writes = self.sessions.get(session_id)
        if writes is None:
            writes = self.sessions[session_id] = SessionWrites()
        return writes

    def empty(self) -> bool:
        """Whether the commit writes nothing."""
        return all(w.empty() for w in self.sessions.values())


@dataclass(frozen=True)
class SessionSummary:
    """What a listing needs of a stored session, without its events."""

    header: session_pb2.SessionHeader
    event_count: int
    turn_count: int
    pending: int = 0
    """Entries in the durable inbox."""
    disposed_ns: int = 0
    """When the agent that last drove it was disposed (ns since the epoch); 0 while an
    agent drives it, or when none was ever disposed on it (retention reads it)."""


@dataclass(frozen=True)
class StoredSession:
    """A whole stored session, as a load returns it."""

    header: session_pb2.SessionHeader
    events: list[ev.SessionEvent]
    inbox: list[InboxEntry]
    options: agent_pb2.AgentOptions | None = None
    """The options of the session's last driver; None when none were stored."""
    driver: str = ""
    """The agent that last drove the session ("" when none did)."""


class SessionStore(Protocol):
    """A place to keep sessions: the interface every store implements."""

    persistent: bool
    """Whether sessions survive a restart of the server."""

    remote: bool
    """Whether a commit is a round trip to another process (a database server): the
    journal then lets every ready callback write before it starts one."""

    async def open(self) -> None:
        """Open the store now (creating it if needed) rather than on first use."""
        ...

    async def close(self) -> None:
        """Release the store's resources."""
        ...

    async def commit(self, commit: Commit) -> None:
        """Write everything in `commit` in one transaction.

        Raises `AlreadyExists` when a session to create exists, `NotFound` when a
        session written to does not, `StoreConflict` when events do not follow the
        stored ones.
        """
        ...

    async def claim(self, session_id: str) -> int:
        """Take the session over: a new token that fences off every earlier claim.

        Raises `NotFound` if the session is unknown.
        """
        ...

    async def exists(self, session_id: str) -> bool:
        """Whether the session is stored."""
        ...

    async def load(self, session_id: str, start: int = FIRST_SEQ) -> StoredSession:
        """The header, the events from seq `start` on and the inbox; `NotFound` if unknown.

        `start` past the last event loads no event (a resume that read its tail already).
        """
        ...

    async def read(self, session_id: str, start: int, end: int) -> list[ev.SessionEvent]:
        """The stored events with `start <= seq < end`, in order (`start` 0 reads as 1)."""
        ...

    async def summary(self, session_id: str) -> SessionSummary:
        """The header and counts; `NotFound` if the session is unknown."""
        ...

    async def list_ids(self) -> list[str]:
        """Every stored session id, sorted."""
        ...

    async def fork(
        self,
        source_id: str,
        boundary_seq: int | None,
        new_id: str,
        header: session_pb2.SessionHeader,
    ) -> int:
        """Create `new_id` with the events of `source_id` up to a `turn_end`, atomically.

        The fork keeps the source's stored agent options.

        `boundary_seq` None means the last `turn_end`. Returns the seed length (the
        boundary's seq, as seqs start at 1).
        Raises `InvalidArgument` (field `boundary_seq`) for a boundary that is not a
        stored `turn_end`, `AlreadyExists` if `new_id` exists, `NotFound` if the
        source is unknown.
        """
        ...

    async def find_request(self, agent_id: str, request_id: str) -> RequestRecord | None:
        """The recorded answer of an earlier call with this request id, if any."""
        ...

    async def request_ids(self, agent_id: str, limit: int) -> list[str] | None:
        """Every request id recorded for the agent; None when there are more than `limit`."""
        ...

    async def session_requests(self, session_id: str) -> list[RequestRecord]:
        """The request records written with the session, with their `stored_ns`.

        Sorted by agent and request id; an export or a move carries them along.
        """
        ...

    async def wait_for_events(self, session_id: str, seconds: float) -> None:
        """Return when another process stored events of the session, or after `seconds`."""
        ...

    async def driven_by(self, agent_id: str) -> list[str]:
        """The sessions `agent_id` drove, the most recent first."""
        ...

    async def delete(self, session_id: str, answer: Answer | None = None) -> int:
        """Remove the session whole, in one transaction; the number of events removed.

        Its header, events, inbox and the request records written with it go; its
        forks stay (they hold copies). `answer`, when given, makes the delete's own
        request record, stored in the same transaction under no session. Raises
        `NotFound` if the session is unknown.
        """
        ...

    async def mark_disposed(self, session_id: str, at_ns: int) -> None:
        """Record that the session's driver was disposed at `at_ns` (ns since the epoch).

        The next commit that names a driver (a resume) clears the mark. An unknown
        session is left alone (it was deleted meanwhile).
        """
        ...

    async def drop_requests(self, before_ns: int, limit: int) -> int:
        """Remove at most `limit` request records stored before `before_ns`; how many."""
        ...

    async def reclaim(self) -> None:
        """Give space freed by removals back (SQLite: a bounded incremental vacuum)."""
        ...

    async def try_lease(self, name: str) -> bool:
        """Take the store-wide lease `name` unless another process holds it (replicas)."""
        ...

    async def release_lease(self, name: str) -> None:
        """Give the lease `name` back."""
        ...

    async def adopt_pending(self, agent_id: str, session_id: str) -> list[InboxEntry]:
        """Move the inbox of every other session last driven by `agent_id` to `session_id`.

        Used when a config agent starts on a fresh session: what it had accepted
        before a shutdown or a crash comes back with it. Returns the moved entries
        in acceptance order, renumbered after the target's own.
        """
        ...


def check_follows(session_id: str, stored: int, events: Sequence[ev.SessionEvent]) -> None:
    """Raise `StoreConflict` unless `events` follow `stored` events with no gaps."""
    for offset, event in enumerate(events):
        if event.seq != FIRST_SEQ + stored + offset:
            raise StoreConflict(
                f'session "{session_id}": event {event.seq} does not follow the'
                f" {stored + offset} stored"
            )


def check_fence(session_id: str, stored: int, fence: int) -> None:
    """Raise `StoreConflict` when a fenced write carries a superseded claim token."""
    if fence and fence != stored:
        raise StoreConflict(
            f'session "{session_id}" was taken over by another writer'
            f" (claim {stored}; this writer holds {fence})"
        )


def check_count(session_id: str, recorded: int, found: int) -> None:
    """Raise `SessionDamaged` unless the log holds the `recorded` number of events.

    A commit stores its events and the session's new count in one transaction, so a
    crash never parts them: a log cut short by a crash mid-turn still holds every
    event its count records (its open turn is repaired when it is resumed). A log
    holding fewer lost its last rows after they were stored.
    """
    if found < recorded:
        raise SessionDamaged(
            session_id,
            f"its last {recorded - found} events are missing (the store recorded"
            f" {recorded}; the log ends at seq {found + FIRST_SEQ - 1})",
        )
    if found > recorded:
        raise SessionDamaged(
            session_id, f"the log holds {found} events, the store recorded {recorded}"
        )


def turn_of(events: Sequence[ev.SessionEvent]) -> int:
    """The highest `turn_start` turn among `events` (0 if none)."""
    turn = 0
    for event in events:  # a loop, not a generator: this runs for every commit
        if event.HasField("turn_start") and event.turn_start.turn > turn:
            turn = event.turn_start.turn
    return turn


def fork_boundary(
    session_id: str, boundary_seq: int | None, count: int, kind_at: str | None, last_end: int | None
) -> int:
    """The validated fork boundary: a stored `turn_end` (default: the last one).

    `kind_at` is the payload kind of the event at `boundary_seq` (None when it is out
    of range); `last_end` the seq of the last `turn_end` (None when there is none).
    """
    if boundary_seq is None:
        if last_end is None:
            raise InvalidArgument("boundary_seq", f'session "{session_id}" has no turn_end')
        return last_end
    if not FIRST_SEQ <= boundary_seq < FIRST_SEQ + count or kind_at is None:
        raise InvalidArgument(
            "boundary_seq", f"{boundary_seq} is out of range (the log has {count} events)"
        )
    if kind_at != "turn_end":
        raise InvalidArgument(
            "boundary_seq", f"event {boundary_seq} is a {kind_at}, not a turn_end"
        )
    return boundary_seq


def decode_entry(entry_id: int, kind: str, blob: bytes) -> InboxEntry:
    """An inbox entry from its stored row."""
    message: ev.UserMessage | ev.ContextMessage = (
        ev.ContextMessage.FromString(blob)
        if kind == INBOX_CONTEXT
        else ev.UserMessage.FromString(blob)
    )
    return InboxEntry(entry_id, kind, message)


def decode_events(
    session_id: str, start: int, rows: Sequence[tuple[int, bytes]]
) -> list[ev.SessionEvent]:
    """Stored (seq, bytes) rows from `start`, as events.

    Raises `SessionDamaged` for a gap, or for a row that is not the event its key says.
    """
    events = []
    for index, (seq, blob) in enumerate(rows, start=start):
        if seq != index:
            raise SessionDamaged(session_id, f"event {index} is missing")
        event = ev.SessionEvent.FromString(blob)
        if event.seq != seq or event.WhichOneof("payload") is None:
            raise SessionDamaged(session_id, f"event {seq} is not a session event")
        events.append(event)
    return events


DECODE_SLICE = 512
"""Events a whole log's load decodes between two yields to the event loop."""


async def decode_log(
    session_id: str, start: int, rows: Sequence[tuple[int, bytes]]
) -> list[ev.SessionEvent]:
    """`decode_events` of a whole log, `DECODE_SLICE` rows at a time.

    The event loop runs other tasks between two slices: a long log's load (a resume)
    does not hold it (69,000 events took about 200 ms in one stretch).
    """
    events: list[ev.SessionEvent] = []
    for first in range(0, len(rows), DECODE_SLICE):
        if first:
            await asyncio.sleep(0)
        events += decode_events(session_id, start + first, rows[first : first + DECODE_SLICE])
    return events
