"""A stored log replays from its last compaction: the same history, header and turns as whole.

Logs are written by a detached `SessionLog` (the loop's own appends), stored in the
real SQLite and PostgreSQL stores, and read back from the replay point
(`server/sessions/replay.py`); each store read is counted on the way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.sessions.replay import replay_tail
from server.sessions.session import SessionLog
from server.stores import FIRST_SEQ, SessionStore
from server.stores.postgres import PostgresStore
from server.stores.sqlite import SqliteStore
from tests.postgres import drop_database, fresh_database
from tests.stores import append_events, create_session

Read = Callable[[str, int, int], Awaitable[list[ev.SessionEvent]]]

HEADER = c.RequestHeader(config=c.ModelConfig(provider="scripted", model="m"), system="be brief")


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    s: SessionStore
    if request.param == "sqlite":
        s = SqliteStore(tmp_path / "agentloop.db")
    else:
        server = request.getfixturevalue("postgres_server")
        dsn = await fresh_database(server)
        s = PostgresStore(dsn)
    await s.open()
    yield s
    await s.close()
    if request.param == "postgres":
        await drop_database(server, dsn)


def text(value: str) -> list[c.ContentBlock]:
    return [c.ContentBlock(text=c.TextBlock(text=value))]


def exchange(log: SessionLog, words: str) -> None:
    """One prompt and its answer, inside the open turn."""
    log.add(ev.UserMessage(content=text(words)))
    log.add(ev.AssistantMessage(content=text(f"said {words}")))


def closed_turn(log: SessionLog, words: str) -> None:
    turn = log.max_turn + 1
    log.add(ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE))
    exchange(log, words)
    log.add(ev.TurnEnd(turn=turn, reason=ev.TurnEndReason(completed=ev.TurnCompleted())))


def compact(log: SessionLog, keep: int, *, header: bool = True) -> ev.SessionEvent:
    """A summary replacing every surface node but the last `keep`, as the loop records it."""
    nodes = log.projection.surface()
    end = len(nodes) - keep - 1
    info = ev.Compaction(
        trigger=ev.COMPACTION_TRIGGER_THRESHOLD,
        first_seq=nodes[0][1],
        last_seq=nodes[end][1],
        replaced_nodes=end + 1,
    )
    if header and log.request_header is not None:
        info.header.CopyFrom(log.request_header)
    message = ev.ContextMessage(
        content=text(f"summary of {end + 1} nodes"),
        source=c.Source(kind="compaction"),
        envelope=ev.CONTEXT_ENVELOPE_CONTEXT,
        compaction=info,
    )
    replace = ev.SurfaceOp(kind=ev.SURFACE_OP_KIND_REPLACE, start=0, end=end)
    return log.add(message, surface_op=replace)


def new_log() -> SessionLog:
    log = SessionLog("s", session_pb2.SessionHeader(cwd="/w"))
    log.add(ev.RequestHeaderLogged(header=HEADER, reason=ev.HEADER_REASON_INITIAL))
    return log


class Counting:
    """A store's `read`, counting the events it returned."""

    def __init__(self, read: Read) -> None:
        self.inner = read
        self.read = 0

    async def __call__(self, session_id: str, start: int, end: int) -> list[ev.SessionEvent]:
        events = await self.inner(session_id, start, end)
        self.read += len(events)
        return events


async def replayed(store: SessionStore, log: SessionLog) -> tuple[SessionLog, int]:
    """`log` stored, then seeded from its replay point as a load does; and events read."""
    await create_session(store, "s", log.header)
    await append_events(store, "s", log.events)
    read = store.read
    counting = Counting(read)
    store.read = counting  # type: ignore[method-assign]
    try:
        tail = await replay_tail(store, "s", len(log))
    finally:
        store.read = read  # type: ignore[method-assign]
    seeded = SessionLog("s", log.header, first_seq=tail[0].seq if tail else FIRST_SEQ)
    await seeded.seed_in_slices(tail)
    return seeded, counting.read


def assert_same(seeded: SessionLog, whole: SessionLog) -> None:
    assert seeded.derive_messages() == whole.derive_messages()
    assert seeded.request_header == whole.request_header
    assert (seeded.max_turn, seeded.open_turn) == (whole.max_turn, whole.open_turn)
    assert len(seeded) == len(whole)
    assert [m for m, _ in seeded.projection.surface()] == [m for m, _ in whole.projection.surface()]


async def test_a_long_log_replays_from_its_last_compaction_only(store: SessionStore) -> None:
    log = new_log()
    for round_ in range(3):
        for i in range(1500):
            closed_turn(log, f"r{round_} t{i}")
        turn = log.max_turn + 1
        log.add(ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE))
        summary = compact(log, keep=4)
        exchange(log, f"after compaction {round_}")
        log.add(ev.TurnEnd(turn=turn, reason=ev.TurnEndReason(completed=ev.TurnCompleted())))
    for i in range(10):
        closed_turn(log, f"last t{i}")
    seeded, read = await replayed(store, log)
    assert_same(seeded, log)
    first = summary.context_message.compaction.last_seq + 1
    assert seeded.window_start == first
    # What a replay reads is the log since the last compaction (a slice more), not 22,500.
    assert len(log) - first < read <= len(log) - first + 2048 + 1
    # Appends continue the log's numbering and its history.
    closed_turn(seeded, "one more")
    closed_turn(log, "one more")
    assert_same(seeded, log)


async def test_a_turn_open_since_before_the_kept_part_replays_from_its_start(
    store: SessionStore,
) -> None:
    log = new_log()
    closed_turn(log, "first")
    turn = log.max_turn + 1
    start = log.add(ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE))
    for i in range(6):  # a long turn: the compaction keeps only its end
        exchange(log, f"step {i}")
    compact(log, keep=2)
    exchange(log, "after")
    # A crash: the turn is still open. Its repair needs everything from its start.
    seeded, _ = await replayed(store, log)
    assert seeded.window_start == start.seq
    assert_same(seeded, log)
    assert seeded.open_turn == turn


async def test_a_log_without_a_replay_point_is_read_whole(store: SessionStore) -> None:
    log = new_log()
    for i in range(5):
        closed_turn(log, f"t{i}")
    compact(log, keep=2, header=False)  # as recorded before compactions kept their header
    closed_turn(log, "after")
    seeded, read = await replayed(store, log)
    assert seeded.window_start == FIRST_SEQ and read == len(log)
    assert_same(seeded, log)
