"""The session log: an append-only list of `SessionEvent`s and the history derived from it.

Appends are synchronous. Each one gets the next sequence number and the time, passes
the pre-commit checks (surface rules, a `pre_commit` veto), is applied to the derived
state, handed to the journal for the next group commit, and passed to the in-process
observers, whose failures are contained. An append from inside an observer is
refused: observers must defer, or use other channels.

Nothing leaves the process before it is stored: readers (`read`, `wait_beyond`) and
the post-commit observers see an event only once the journal has committed it (the
durable mark). Memory holds what the next model request needs (the derived history,
the folded request header, turn numbering) and a bounded window of recent events;
older events are read back from the store.

The log's other jobs are parts of their own: the history and its folds
(`projection.py`), the durable inbox (`inbox.py`), the wire bytes kept for recent
events (`encoded.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf import timestamp_pb2

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.kernel.errors import AgentLoopError
from server.kernel.events import PAYLOAD_KINDS, Payload
from server.kernel.history import MessageView
from server.sessions.inbox import DurableInbox
from server.sessions.projection import FOLDED_KINDS, SURFACE_KINDS, Projection
from server.stores import FIRST_SEQ, InboxEntry, RequestRecord

if TYPE_CHECKING:
    from server.sessions.journal import Journal

log = logging.getLogger(__name__)


WINDOW = 64
"""Recent events a session keeps in memory; readers of older ones go to the store."""

ENCODED_KEPT = 64
"""Recent events whose wire bytes a session keeps: serialized once, for the store and
for every stream that sends them."""

ENCODED_MAX = 4096
"""Larger events are serialized again where needed rather than kept twice."""

SEED_SLICE = 512
"""Stored events a loaded log applies in one stretch of the event loop (`seed_in_slices`):
a few milliseconds of projecting messages."""

UNNOTED = 2**63
"""`SessionLog.note_kinds` not asked (or asked for every kind): no run is known free."""

Observer = Callable[[ev.SessionEvent], Any]
BatchObserver = Callable[[Sequence[ev.SessionEvent]], Any]


class ReentrantAppend(RuntimeError):
    """An observer tried to append while an append was being published."""


def now_timestamp() -> timestamp_pb2.Timestamp:
    """The current time as a protobuf Timestamp."""
    ns = time.time_ns()
    return timestamp_pb2.Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


class SessionLog:
    """One session: its header, its recent events, its derived history and folded header."""

    def __init__(
        self,
        session_id: str,
        header: session_pb2.SessionHeader,
        journal: Journal | None = None,
        seed: Iterable[ev.SessionEvent] = (),
        inbox: Sequence[InboxEntry] = (),
        window: int = WINDOW,
        options: agent_pb2.AgentOptions | None = None,
        first_seq: int = FIRST_SEQ,
    ) -> None:
        """A session whose writes go through `journal`.

        Without a journal it is a detached log (a replay, a test fixture) that keeps
        every event and treats each append as stored at once. `first_seq` is the seq
        of the first seeded event: a stored log is seeded from its replay point
        (`replay.py`), the older events staying in the store.
        """
        self.session_id = session_id
        self.header = header
        self.journal = journal
        self.first_seq = first_seq
        """The seq of the first event seeded: older ones are only in the store."""
        self.count = first_seq
        """The next sequence number (events appended so far, stored or not, plus 1)."""
        self.durable = first_seq
        """Events with seq below `durable` are stored and published: the next to store."""
        self._window: deque[ev.SessionEvent] = deque(maxlen=window if journal else None)
        self.observers: list[Observer] = []
        """Called in-process at each append; failures are logged and contained."""
        self.committed_batches: list[BatchObserver] = []
        """Called once per run of events stored together, before `committed_observers`:
        one call per run, not per event (a long turn's chunks are stored by hundreds)."""
        self.committed_observers: list[Observer] = []
        """Called once each event is stored, in order; failures are logged and contained."""
        self.pre_commit: list[Observer] = []
        """Called before each append; a throw vetoes the append."""
        self.agent_id = ""
        """The live agent driving this session, if any."""
        self.options = options
        """The options of the session's last agent, as stored (a resume may restore them)."""
        self.projection = Projection(partial=first_seq > FIRST_SEQ)
        """The history and the folds the loop reads (turn numbering, request header)."""
        self.fence = 0
        """The driver's claim token: every commit carries it (0: a reader's log, unfenced)."""
        self.failure: AgentLoopError | None = None
        """Why the store refused this session's writes, once it has (nothing commits then)."""
        self.on_failure: list[Callable[[AgentLoopError], None]] = []
        """Told once, when the store refuses the session (its driver must stop)."""
        self.inbox = DurableInbox(inbox)
        """Accepted messages no event records yet."""
        self.publishing = ""
        """The payload kind of the event being published to the observers ("" between
        appends): an observer can read it here instead of asking the event."""
        self.noted_kinds: frozenset[str] = frozenset()
        """The event kinds whose appends are noted (`note_kinds`)."""
        self._noted_from = UNNOTED
        """The seq from which appends of `noted_kinds` are noted."""
        self._last_noted = -1
        """The seq of the last append of a noted kind."""
        self._waiters: list[asyncio.Future[None]] = []
        self._encoded: dict[int, bytes] = {}
        """Wire bytes of recent events by seq (see `encoded`)."""
        self.observer_failures = 0
        self._seed(seed)

    def _seed(self, events: Iterable[ev.SessionEvent]) -> None:
        """Apply stored events after those applied so far: they count as stored."""
        for event in events:
            self.projection.apply(event)
            self._window.append(event)
            self.count += 1
        self.durable = self.count

    async def seed_in_slices(self, events: Sequence[ev.SessionEvent]) -> None:
        """Apply stored events as `seed` does, `SEED_SLICE` at a time, yielding between.

        A long session loaded for a resume is O(events) of projecting messages: the
        event loop runs other tasks between two slices. For a log that nobody holds
        yet (the one being loaded): between two slices, it is partly seeded.
        """
        for start in range(0, len(events), SEED_SLICE):
            if start:
                await asyncio.sleep(0)
            self._seed(events[start : start + SEED_SLICE])

    def __len__(self) -> int:
        """The number of events appended, stored or not."""
        return self.count - FIRST_SEQ

    @property
    def stored(self) -> int:
        """The number of events stored and published."""
        return self.durable - FIRST_SEQ

    @property
    def events(self) -> list[ev.SessionEvent]:
        """The events held in memory: the whole log while it fits the window, else its tail."""
        return list(self._window)

    @property
    def window_start(self) -> int:
        """The sequence number of the oldest event held in memory."""
        return self.count - len(self._window)

    def add(
        self,
        payload: Payload,
        *,
        source_event_seqs: Sequence[int] = (),
        consumes: tuple[int, ...] = (),
        surface_op: ev.SurfaceOp | None = None,
    ) -> ev.SessionEvent:
        """Append one event carrying `payload` (its type says its kind); returns the event.

        `consumes` names the inbox entries this event records: they leave the durable
        inbox in the same commit as the event, so a message is pending or recorded,
        never both and never neither. `surface_op` replaces APPEND on a surface event
        (a compaction's REPLACE).
        """
        kind = PAYLOAD_KINDS[type(payload)]  # `kind_of`, inline: this runs for every event
        return self._append(kind, payload, source_event_seqs, consumes, surface_op)

    def add_fields(
        self,
        kind: str,
        fields: dict[str, Any],
        *,
        source_event_seqs: Sequence[int] = (),
        consumes: tuple[int, ...] = (),
    ) -> ev.SessionEvent:
        """`add` of the payload of kind `kind` made of `fields`, built in the event at once.

        For the events a turn appends most (a chunk each, the step's message): the
        fields go straight into the event, so their messages are copied once, not into
        a payload and then the payload into the event.
        """
        return self._append(kind, fields, source_event_seqs, consumes, None)

    def add_chunk(self, turn: int, step: int, chunk: st.StreamChunk) -> ev.SessionEvent:
        """`add_fields("assistant_chunk", ...)`, its fields set in the event in place.

        A turn's most frequent event (a chunk each): set in place, an event costs about a
        third less than through the constructor, whose dict of fields is read by name.
        """
        if self.publishing:
            raise ReentrantAppend(
                "session append cannot reenter while another append is being published"
            )
        ns = time.time_ns()  # as in `_append`
        event = ev.SessionEvent(seq=self.count)
        stamp = event.create_time
        stamp.seconds = ns // 1_000_000_000
        stamp.nanos = ns % 1_000_000_000
        body = event.assistant_chunk
        body.turn = turn
        body.step = step
        body.chunk.CopyFrom(chunk)
        return self._record(event, "assistant_chunk", ())

    def _append(
        self,
        kind: str,
        payload: Payload | dict[str, Any],
        source_event_seqs: Sequence[int],
        consumes: tuple[int, ...],
        surface_op: ev.SurfaceOp | None,
    ) -> ev.SessionEvent:
        if self.publishing:
            raise ReentrantAppend(
                "session append cannot reenter while another append is being published"
            )
        if source_event_seqs and kind not in SURFACE_KINDS:
            raise ValueError(f"{kind} is not a surface event and takes no source_event_seqs")
        ns = time.time_ns()  # now_timestamp's, inline: this runs for every event
        # Fields given as a dict go in one constructor call (a Python loop setting them
        # costs more); a payload message, the time and the surface fields are set in
        # place, about twice as cheap as the same handed to the constructor.
        if type(payload) is dict:
            fields: dict[str, Any] = {kind: payload, "seq": self.count}  # a oneof field
            event = ev.SessionEvent(**fields)
        else:
            event = ev.SessionEvent(seq=self.count)
            getattr(event, kind).CopyFrom(payload)
        stamp = event.create_time
        stamp.seconds = ns // 1_000_000_000
        stamp.nanos = ns % 1_000_000_000
        if kind in SURFACE_KINDS:
            if surface_op is None:
                event.surface_op.kind = ev.SURFACE_OP_KIND_APPEND
            else:
                event.surface_op.CopyFrom(surface_op)
            if source_event_seqs:
                event.source_event_seqs.extend(source_event_seqs)
        return self._record(event, kind, consumes)

    def _record(
        self, event: ev.SessionEvent, kind: str, consumes: tuple[int, ...]
    ) -> ev.SessionEvent:
        """Append a built event: checks, projection, window, journal, observers."""
        for check in self.pre_commit:
            check(event)
        if kind in FOLDED_KINDS:  # most events (chunks, steps, tools) fold nothing: no call
            self.projection.apply(event, kind)
        if kind in self.noted_kinds:
            self._last_noted = self.count
        self.count += 1
        self._window.append(event)
        if consumes:
            self.inbox.consume(consumes)
        if self.journal is not None:
            self.journal.append(self, event, consumes)
        if self.observers:  # published here, not in a method of its own: once per event
            self.publishing = kind
            try:
                for observer in self.observers:
                    try:
                        observer(event)
                    except Exception:
                        self.observer_failures += 1
                        log.warning("session/event observer failed", exc_info=True)
            finally:
                self.publishing = ""
        if self.journal is None:
            self.published([event])
        return event

    def accept(self, kind: str, message: ev.UserMessage | ev.ContextMessage) -> InboxEntry:
        """Put an accepted message in the durable inbox (stored with the next commit)."""
        entry = self.inbox.accept(kind, message)
        if self.journal is not None:
            self.journal.put(self, entry)
        return entry

    def adopt(self, entries: Sequence[InboxEntry]) -> None:
        """Take up inbox entries the store already moved to this session."""
        self.inbox.adopt(entries)

    def record(self, record: RequestRecord) -> None:
        """Keep the first answer of a call with a request id, in the next commit."""
        if self.journal is not None:
            self.journal.record(self, record)

    def note_kinds(self, kinds: frozenset[str] | None) -> None:
        """Note the appends of events of `kinds` from now on (None: of every kind).

        Kinds some observer of stored runs wants: a run holding none of them
        (`none_noted_from`) passes it by whole, its events unread. One set at a time:
        the driving agent's.
        """
        self.noted_kinds = frozenset() if kinds is None else kinds
        self._noted_from = UNNOTED if kinds is None else self.count

    def none_noted_from(self, seq: int) -> bool:
        """Whether no event appended from `seq` on is of a noted kind.

        False also when it cannot tell: an event from `seq` on came before the kinds
        were noted (or every kind is).
        """
        return self._noted_from <= seq and self._last_noted < seq

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run `callback` once everything this session wrote so far is stored (now if it is).

        The one way to tell anyone outside about what the session just recorded: nothing
        reaches a client, a plugin or another replica before it is stored.
        """
        if self.journal is None:
            callback()
        else:
            self.journal.after_commit(callback, self)

    async def settle(self) -> None:
        """Wait until everything so far is stored; raises the store's refusal, if any."""
        if self.journal is not None:
            stored = self.journal.waiter()
            if stored is not None:  # else nothing is pending: no task switch
                await stored
        if self.failure is not None:
            raise self.failure

    def derive_messages(self) -> list[c.Message]:
        """The history, a new list (`Projection.messages`)."""
        return self.projection.messages()

    def history(self) -> MessageView:
        """The history as it is now, without a copy (`Projection.view`)."""
        return self.projection.view()

    @property
    def max_turn(self) -> int:
        """The highest turn number logged."""
        return self.projection.max_turn

    @property
    def open_turn(self) -> int:
        """The turn whose `turn/start` is the last boundary; 0 when none is open."""
        return self.projection.open_turn

    @property
    def request_header(self) -> c.RequestHeader | None:
        """The latest logged request header."""
        return self.projection.request_header

    async def read(
        self, start: int, limit: int, max_bytes: int | None = None
    ) -> list[ev.SessionEvent]:
        """Up to `limit` stored events from `start` (at least one, then within `max_bytes`)."""
        start = max(start, FIRST_SEQ)
        out: list[ev.SessionEvent] = []
        size = 0
        while len(out) < limit:
            pos = start + len(out)
            end = min(self.durable, start + limit)
            if pos >= end:
                break
            first = self.window_start
            if pos >= first:
                chunk = list(itertools.islice(self._window, pos - first, end - first))
            else:
                assert self.journal is not None  # a detached log keeps every event
                chunk = await self.journal.store.read(self.session_id, pos, min(end, first))
                if not chunk:
                    break
            for event in chunk:
                if max_bytes is not None:
                    size += event.ByteSize()
                    if out and size > max_bytes:
                        return out
                out.append(event)
        return out

    def encoded(self, event: ev.SessionEvent) -> bytes:
        """The wire bytes of one of this log's events, serialized once for all who send it.

        The journal's store writes them, and every stream that follows the session sends
        the same bytes: an event is not serialized again per reader.
        """
        raw = self._encoded.get(event.seq)
        if raw is not None:
            return raw
        raw = event.SerializeToString()
        seq = event.seq
        if len(raw) <= ENCODED_MAX:
            self._encoded[seq] = raw
        if not seq % ENCODED_KEPT:
            # Once per ENCODED_KEPT events (they are encoded in runs of consecutive seqs:
            # the journal's commits, the streams' reads of the window), not a size check
            # per event: the older ones go.
            floor = self.count - ENCODED_KEPT
            self._encoded = {s: b for s, b in self._encoded.items() if s >= floor}
        return raw

    async def read_encoded(self, start: int, limit: int, max_bytes: int) -> list[bytes]:
        """`read`, as the events' wire bytes (those of recent events are serialized once)."""
        start = max(start, FIRST_SEQ)
        out: list[bytes] = []
        size = 0
        while len(out) < limit:
            pos = start + len(out)
            end = min(self.durable, start + limit)
            if pos >= end:
                break
            first = self.window_start
            if pos >= first:
                recent = itertools.islice(self._window, pos - first, end - first)
                chunk = [self.encoded(event) for event in recent]
                whole = sum(map(len, chunk))
                if size + whole <= max_bytes:
                    # The common case, a turn's burst: all of it fits, no loop per event.
                    size += whole
                    out += chunk
                    continue
            else:
                assert self.journal is not None  # a detached log keeps every event
                stored = await self.journal.store.read(self.session_id, pos, min(end, first))
                if not stored:
                    break
                chunk = [event.SerializeToString() for event in stored]
            for raw in chunk:
                size += len(raw)
                if out and size > max_bytes:
                    return out
                out.append(raw)
        return out

    async def wait_beyond(self, seq: int) -> None:
        """Wait until the stored log holds an event with sequence number `seq` (or more)."""
        if self.durable > seq:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def wake_waiters(self) -> None:
        """Release every `wait_beyond` waiter (they re-check their condition)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def published(self, events: Sequence[ev.SessionEvent]) -> None:
        """The journal stored `events`: advance the durable mark and tell the readers."""
        if events:
            self.durable = events[-1].seq + 1
            for observe in self.committed_batches:
                try:
                    observe(events)
                except Exception:
                    self.observer_failures += 1
                    log.warning("post-commit session observer failed", exc_info=True)
            for observer in self.committed_observers:
                for event in events:
                    try:
                        observer(event)
                    except Exception:
                        self.observer_failures += 1
                        log.warning("post-commit session observer failed", exc_info=True)
        if self._waiters:
            self.wake_waiters()

    def fail(self, error: AgentLoopError) -> None:
        """The store refused this session's writes: nothing of it commits from now on."""
        if self.failure is not None:
            return
        self.failure = error
        self.wake_waiters()
        for callback in self.on_failure:
            try:
                callback(error)
            except Exception:
                log.warning("a session failure callback failed", exc_info=True)


def session_message(session: SessionLog) -> session_pb2.Session:
    """The `Session` resource of a session log."""
    return session_pb2.Session(
        session_id=session.session_id,
        agent_id=session.agent_id,
        header=session.header,
        event_count=session.stored,
        turn_count=session.max_turn,
        pending_messages=len(session.inbox),
    )
