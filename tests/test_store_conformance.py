"""One suite for every session store: what the loop relies on, whatever the backend."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf import timestamp_pb2

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    SessionDamaged,
)
from server.sessions.repair import crash_closers
from server.stores import (
    INBOX_CONTEXT,
    INBOX_MESSAGE,
    Commit,
    InboxEntry,
    RequestRecord,
    SessionStore,
    SessionWrites,
    StoreConflict,
)
from server.stores.memory import MemoryStore
from server.stores.postgres import PostgresStore
from server.stores.sqlite import SqliteStore
from tests.postgres import drop_database, fresh_database
from tests.stores import append_events, create_session


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    s: SessionStore
    if request.param == "memory":
        s = MemoryStore(persistent=True)
    elif request.param == "sqlite":
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


def header(created: int = 1) -> session_pb2.SessionHeader:
    return session_pb2.SessionHeader(cwd="/w", create_time=timestamp_pb2.Timestamp(seconds=created))


def turns(count: int, first_seq: int = 1, first_turn: int = 1) -> list[ev.SessionEvent]:
    """`count` closed turns (turn_start, user_message, turn_end each) from `first_seq`."""
    events: list[ev.SessionEvent] = []
    for turn in range(first_turn, first_turn + count):
        for payload in (
            {"turn_start": ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE)},
            {"user_message": ev.UserMessage(content=[text(f"t{turn}")], request_id=f"r{turn}")},
            {"turn_end": ev.TurnEnd(turn=turn)},
        ):
            events.append(ev.SessionEvent(seq=first_seq + len(events), **payload))
    return events


def text(value: str) -> c.ContentBlock:
    return c.ContentBlock(text=c.TextBlock(text=value))


def entry(entry_id: int, value: str, kind: str = INBOX_MESSAGE) -> InboxEntry:
    message: ev.UserMessage | ev.ContextMessage = (
        ev.ContextMessage(content=[text(value)])
        if kind == INBOX_CONTEXT
        else ev.UserMessage(content=[text(value)], request_id=value)
    )
    return InboxEntry(entry_id, kind, message)


async def test_events_round_trip_with_counts_ranges_and_listing(store: SessionStore) -> None:
    await create_session(store, "s1", header())
    events = turns(3)
    await append_events(store, "s1", events[:4])
    await append_events(store, "s1", events[4:])
    loaded = await store.load("s1")
    assert loaded.header == header() and loaded.events == events and loaded.inbox == []
    assert await store.read("s1", 3, 6) == events[2:5]  # seqs start at 1
    assert await store.read("s1", 9, 100) == events[8:]
    assert await store.read("s1", 0, 2) == events[:1]  # 0 names no event: reads from 1
    summary = await store.summary("s1")
    assert (summary.event_count, summary.turn_count, summary.pending) == (9, 3, 0)
    assert await store.list_ids() == ["s1"]
    assert await store.exists("s1") and not await store.exists("nope")


async def test_a_load_from_a_seq_reads_the_events_from_there_with_the_rest_whole(
    store: SessionStore,
) -> None:
    await create_session(store, "s1", header())
    events = turns(4)
    await append_events(store, "s1", events[:5])  # SQLite stores a batch as one row:
    await append_events(store, "s1", events[5:])  # the cut falls inside the first one
    await store.commit(Commit({"s1": SessionWrites(inbox_put=[entry(1, "waiting")])}))
    whole = await store.load("s1")
    tail = await store.load("s1", start=4)
    assert tail.events == events[3:] and tail.events[0].seq == 4
    assert (tail.header, tail.inbox, tail.options, tail.driver) == (
        whole.header,
        whole.inbox,
        whole.options,
        whole.driver,
    )
    assert (await store.load("s1", start=13)).events == []  # past the end: no event
    assert (await store.load("s1", start=0)).events == events  # 0 names no event
    with pytest.raises(NotFound):
        await store.load("nope", start=2)


async def test_refusals_change_nothing(store: SessionStore) -> None:
    await create_session(store, "s1", header())
    with pytest.raises(AlreadyExists):
        await create_session(store, "s1", header())
    with pytest.raises(NotFound):
        await store.load("nope")
    with pytest.raises(NotFound):
        await append_events(store, "nope", turns(1))
    with pytest.raises(StoreConflict, match="does not follow"):
        await append_events(store, "s1", turns(1, first_seq=2))  # a gap
    await append_events(store, "s1", turns(1))
    with pytest.raises(StoreConflict):
        await append_events(store, "s1", turns(1))  # a second writer at the same seqs
    # One refused session refuses the whole commit: the other session's writes too.
    await create_session(store, "s2", header())
    both = Commit(
        {
            "s2": SessionWrites(events=turns(1), inbox_put=[entry(1, "x")]),
            "s1": SessionWrites(events=turns(1)),
        }
    )
    with pytest.raises(StoreConflict):
        await store.commit(both)
    assert (await store.summary("s2")).event_count == 0
    assert (await store.load("s2")).inbox == []
    assert (await store.load("s1")).events == turns(1)


async def test_the_inbox_holds_what_no_event_recorded(store: SessionStore) -> None:
    await create_session(store, "s1", header())
    puts = [entry(1, "a"), entry(2, "b"), entry(3, "c", INBOX_CONTEXT)]
    await store.commit(Commit({"s1": SessionWrites(inbox_put=puts)}))
    assert (await store.summary("s1")).pending == 3
    # The event recording "a" and the removal of its entry land together.
    recording = turns(1)
    await store.commit(Commit({"s1": SessionWrites(events=recording, inbox_take=[1])}))
    loaded = await store.load("s1")
    assert loaded.inbox == puts[1:] and loaded.events == recording


async def test_request_records_keep_the_first_answer(store: SessionStore) -> None:
    await create_session(store, "s1", header())
    first = RequestRecord("a1", "r1", "SendMessage", b"first")
    await store.commit(Commit({"s1": SessionWrites(requests=[first])}))
    again = RequestRecord("a1", "r1", "SendMessage", b"second")
    await store.commit(Commit({"s1": SessionWrites(requests=[again])}))
    assert await store.find_request("a1", "r1") == first
    assert await store.find_request("a2", "r1") is None  # ids are scoped to the agent


async def test_request_ids_lists_an_agents_ids_up_to_a_limit(store: SessionStore) -> None:
    await create_session(store, "s1", header())
    records = [RequestRecord("a1", f"r{i}", "SendMessage", b"") for i in range(3)]
    records.append(RequestRecord("a2", "other", "SendMessage", b""))
    await store.commit(Commit({"s1": SessionWrites(requests=records)}))
    assert sorted(await store.request_ids("a1", 3) or []) == ["r0", "r1", "r2"]
    assert await store.request_ids("a1", 2) is None  # more than the limit
    assert await store.request_ids("a3", 10) == []


async def test_fork_copies_up_to_a_turn_end_or_refuses(store: SessionStore) -> None:
    await create_session(store, "src", header())
    events = turns(3)
    open_tail = ev.SessionEvent(seq=10, turn_start=ev.TurnStart(turn=4))
    await append_events(store, "src", [*events, open_tail])
    assert await store.fork("src", None, "last", header(2)) == 9  # the last turn_end
    assert await store.fork("src", 6, "middle", header(2)) == 6
    fork = await store.load("middle")
    assert fork.events == events[:6] and fork.header.seed_length == 6
    assert (await store.summary("middle")).turn_count == 2
    for boundary, problem in ((5, "not a turn_end"), (11, "out of range"), (0, "out of range")):
        with pytest.raises(InvalidArgument, match=problem) as refused:
            await store.fork("src", boundary, "bad", header(2))
        assert refused.value.field == "boundary_seq"
    assert not await store.exists("bad")
    with pytest.raises(AlreadyExists):
        await store.fork("src", None, "last", header(2))
    with pytest.raises(NotFound):
        await store.fork("nope", None, "other", header(2))
    await create_session(store, "empty", header())
    with pytest.raises(InvalidArgument, match="no turn_end"):
        await store.fork("empty", None, "other", header(2))


async def test_adopt_moves_an_agents_pending_messages_in_acceptance_order(
    store: SessionStore,
) -> None:
    for session_id, created, driver in (("old", 1, "bot"), ("older", 0, "bot"), ("x", 2, "other")):
        await store.commit(
            Commit({session_id: SessionWrites(create=header(created), driver=driver)})
        )
    await store.commit(
        Commit(
            {
                "older": SessionWrites(inbox_put=[entry(1, "o1"), entry(2, "o2")]),
                "old": SessionWrites(inbox_put=[entry(1, "n1")]),
                "x": SessionWrites(inbox_put=[entry(1, "other agent")]),
            }
        )
    )
    await store.commit(Commit({"new": SessionWrites(create=header(3), driver="bot")}))
    moved = await store.adopt_pending("bot", "new")
    assert [(e.entry_id, e.message.request_id) for e in moved] == [(1, "o1"), (2, "o2"), (3, "n1")]
    assert (await store.load("new")).inbox == moved
    assert (await store.summary("old")).pending == 0
    assert (await store.summary("x")).pending == 1  # another agent's stay put
    assert await store.adopt_pending("bot", "new") == []


async def test_a_claim_fences_off_earlier_writers(store: SessionStore) -> None:
    await create_session(store, "s1", header())
    first = await store.claim("s1")
    await store.commit(Commit({"s1": SessionWrites(events=turns(1), fence=first)}))
    second = await store.claim("s1")
    assert second > first
    # The earlier writer's next commit fits the sequence but is refused: it lost the session.
    late = Commit({"s1": SessionWrites(events=turns(1, first_seq=4, first_turn=2), fence=first)})
    with pytest.raises(StoreConflict, match="taken over"):
        await store.commit(late)
    stale_inbox = Commit({"s1": SessionWrites(inbox_put=[entry(1, "x")], fence=first)})
    with pytest.raises(StoreConflict):
        await store.commit(stale_inbox)
    assert (await store.summary("s1")).event_count == 3
    assert (await store.load("s1")).inbox == []
    await store.commit(
        Commit({"s1": SessionWrites(events=turns(1, first_seq=4, first_turn=2), fence=second)})
    )
    assert (await store.summary("s1")).event_count == 6
    with pytest.raises(NotFound):
        await store.claim("nope")


async def test_agent_options_are_kept_with_the_session_and_its_forks(store: SessionStore) -> None:
    await create_session(store, "s1", header())
    assert (await store.load("s1")).options is None  # none stored yet
    first = agent_pb2.AgentOptions(provider="scripted", model="m", tools=["word_count"])
    await store.commit(Commit({"s1": SessionWrites(driver="a1", options=first, events=turns(1))}))
    first.model = "changed after the commit"  # the store kept its own copy
    loaded = await store.load("s1")
    assert loaded.options == agent_pb2.AgentOptions(
        provider="scripted", model="m", tools=["word_count"]
    )
    await store.commit(Commit({"s1": SessionWrites(driver="a1")}))  # no options: kept
    assert (await store.load("s1")).options == loaded.options
    await store.fork("s1", None, "child", header(2))
    assert (await store.load("child")).options == loaded.options
    second = agent_pb2.AgentOptions(model="n")
    await store.commit(Commit({"s1": SessionWrites(driver="a2", options=second)}))
    assert (await store.load("s1")).options == second


async def test_delete_removes_the_session_whole_and_keeps_its_forks(store: SessionStore) -> None:
    await create_session(store, "src", header())
    await create_session(store, "other", header())
    events = turns(2)
    kept = RequestRecord("a1", "r-other", "SendMessage", b"other")
    await store.commit(
        Commit(
            {
                "src": SessionWrites(
                    events=events,
                    inbox_put=[entry(1, "pending")],
                    requests=[RequestRecord("a1", "r1", "SendMessage", b"src")],
                ),
                "other": SessionWrites(requests=[kept]),
            }
        )
    )
    await store.fork("src", 3, "fork", header(2))

    def answer(count: int) -> RequestRecord:
        return RequestRecord("session/src", "d1", "DeleteSession", str(count).encode())

    assert await store.delete("src", answer) == 6
    assert not await store.exists("src")
    with pytest.raises(NotFound):
        await store.load("src")
    assert await store.list_ids() == ["fork", "other"]
    assert await store.find_request("a1", "r1") is None  # written with the session: gone
    assert await store.find_request("a1", "r-other") == kept  # another session's: kept
    assert await store.find_request("session/src", "d1") == answer(6)  # outlives it
    assert (await store.load("fork")).events == events[:3]  # the fork holds its own copy
    with pytest.raises(NotFound):
        await store.delete("src")
    # The id is free again: a new session of that id starts empty.
    await create_session(store, "src", header(3))
    loaded = await store.load("src")
    assert loaded.events == [] and loaded.inbox == [] and loaded.header == header(3)


async def cut_tail(store: SessionStore, session_id: str, from_seq: int) -> None:
    """Delete the stored rows of the session's events from `from_seq` on, behind the
    store's back (a restore from a partial backup, a hand edit, a bad disk sector)."""
    if isinstance(store, SqliteStore):  # a row holds a commit's run: cut at a commit's start
        with sqlite3.connect(store.path) as db:
            db.execute(
                "DELETE FROM events WHERE session_id = ? AND seq >= ?", (session_id, from_seq)
            )
    else:
        assert isinstance(store, PostgresStore)
        pool = await store.pool()
        await pool.execute(
            "DELETE FROM events WHERE session_id = $1 AND seq >= $2", session_id, from_seq
        )


@pytest.mark.parametrize("store", ["sqlite", "postgres"], indirect=True)
async def test_a_cut_tail_is_damage_and_a_crash_cut_turn_is_whole(store: SessionStore) -> None:
    await create_session(store, "cut", header())
    await append_events(store, "cut", turns(1))
    await append_events(store, "cut", turns(2, first_seq=4, first_turn=2))
    await cut_tail(store, "cut", 4)  # the last commit's rows: turns 2 and 3
    with pytest.raises(SessionDamaged, match=r"its last 6 events are missing \(the store "
                       r"recorded 9; the log ends at seq 3\)") as damaged:  # fmt: skip
        await store.load("cut")
    assert damaged.value.reason == "SESSION_DAMAGED"  # DATA_LOSS at the API
    assert (await store.summary("cut")).event_count == 9  # the count stays the record
    # A crash mid-turn: the turn's first events were committed, its end never was.
    await create_session(store, "crashed", header())
    await append_events(store, "crashed", turns(1))
    opened = turns(1, first_seq=4, first_turn=2)[:2]  # turn_start and user_message
    await append_events(store, "crashed", opened)
    loaded = await store.load("crashed")
    assert loaded.events == [*turns(1), *opened]
    assert [e.WhichOneof("payload") for e in crash_closers(loaded.events)] == ["turn_end"]
    # A fork keeps its own count: the source cut later does not touch it.
    await store.fork("crashed", 3, "fork", header(2))
    await cut_tail(store, "crashed", 4)
    assert (await store.load("fork")).events == turns(1)
    with pytest.raises(SessionDamaged, match="its last 2 events are missing"):
        await store.load("crashed")


async def test_postgres_refuses_to_delete_a_session_a_replica_leases(postgres_server: str) -> None:
    dsn = await fresh_database(postgres_server)
    store = PostgresStore(dsn)
    try:
        await create_session(store, "s1", header())
        pool = await store.pool()
        await pool.execute(
            "INSERT INTO leases (agent_id, session_id, owner, expires_at, options)"
            " VALUES ('a1', 's1', 'replica-2', now() + interval '1 minute', '')"
        )
        with pytest.raises(FailedPrecondition, match='live agent "a1"') as refused:
            await store.delete("s1")
        assert refused.value.reason == "SESSION_IN_USE"
        assert refused.value.metadata == {"session_id": "s1", "agent_id": "a1"}
        assert await store.exists("s1")  # a refusal changes nothing
        await pool.execute("DELETE FROM leases")
        assert await store.delete("s1") == 0
    finally:
        await store.close()
        await drop_database(postgres_server, dsn)
