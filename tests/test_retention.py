"""The retention sweeper on a real SQLite file and a real PostgreSQL: thousands of
sessions swept in batches while an agent's turns run, request records past the
window dropped, space given back, one sweeper at a time."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf import timestamp_pb2

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from bench.common import OPTIONS, PROMPT
from server.lifecycle.factory import AgentFactory
from server.lifecycle.retention import DAY_NS, Sweeper
from server.lifecycle.runtime import build_runtime
from server.settings.config import Config, load_config
from server.settings.retention import Retention
from server.stores import Commit, InboxEntry, RequestRecord, SessionWrites
from server.stores.postgres import PostgresStore
from tests.postgres import drop_database, fresh_database

OLD, RECENT, PENDING = 2000, 50, 10


@pytest.fixture(params=["sqlite", "postgres"])
async def factory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AgentFactory]:
    if request.param == "sqlite":
        config = Config(store="sqlite", data_dir=str(tmp_path))
    else:
        server = request.getfixturevalue("postgres_server")
        dsn = await fresh_database(server)
        config = Config(store="postgres", postgres_dsn=dsn)
    made = AgentFactory(build_runtime(config))
    await made.runtime.store.open()
    yield made
    await made.close()
    await made.runtime.store.close()
    if request.param == "postgres":
        await drop_database(server, dsn)


def at(ns: int) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(ns)
    return stamp


def one_turn(when: int) -> list[ev.SessionEvent]:
    return [
        ev.SessionEvent(seq=1, create_time=at(when), turn_start=ev.TurnStart(turn=1)),
        ev.SessionEvent(seq=2, create_time=at(when), user_message=ev.UserMessage()),
        ev.SessionEvent(seq=3, create_time=at(when), turn_end=ev.TurnEnd(turn=1)),
    ]


async def stored(factory: AgentFactory, ids: list[str], when: int, pending: bool = False) -> None:
    """Sessions created and last active at `when`, written 500 to a commit."""
    for first in range(0, len(ids), 500):
        commit = Commit()
        for session_id in ids[first : first + 500]:
            writes = commit.of(session_id)
            writes.create = session_pb2.SessionHeader(create_time=at(when))
            writes.events = one_turn(when)
            if pending:
                writes.inbox_put = [InboxEntry(1, "message", ev.UserMessage(request_id="p"))]
        await factory.runtime.store.commit(commit)


async def longest_stall(stop: asyncio.Event) -> float:
    """The longest stretch the event loop did not come back to this task (seconds)."""
    longest = 0.0
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(0.001)
        longest = max(longest, time.perf_counter() - before - 0.001)
    return longest


@pytest.mark.timeout(240)  # thousands of sessions on a shared machine
async def test_a_sweep_deletes_idle_sessions_in_batches_while_turns_run(
    factory: AgentFactory,
) -> None:
    now = time.time_ns()
    old = now - 40 * DAY_NS
    await stored(factory, [f"old-{i:05d}" for i in range(OLD)], old)
    await stored(factory, [f"recent-{i}" for i in range(RECENT)], now - DAY_NS)
    await stored(factory, [f"pending-{i}" for i in range(PENDING)], old, pending=True)
    await stored(factory, ["driven"], old)
    agent = await factory.resume("runner", "driven", OPTIONS)  # live on an old session
    store = factory.runtime.store
    pages_before = pages(factory)

    async def turns() -> int:
        count = 0
        while not stop.is_set():
            agent.send(PROMPT)
            await agent.when_idle()
            count += 1
        return count

    stop = asyncio.Event()
    probe = asyncio.ensure_future(longest_stall(stop))
    running = asyncio.ensure_future(turns())
    sweeper = Sweeper(factory, Retention(idle_session_days=30, sweep_batch=100))
    started = time.perf_counter()
    report = await sweeper.sweep()
    seconds = time.perf_counter() - started
    stop.set()
    stall, done_turns = await probe, await running
    print(
        f"\nswept {report.sessions_swept} sessions in {seconds:.2f} s"
        f" ({report.sessions_swept / seconds:.0f}/s) while {done_turns} turns ran;"
        f" longest event-loop stall {stall * 1000:.1f} ms"
    )
    assert report.sessions_swept == OLD and sweeper.swept_sessions == OLD
    left = await store.list_ids()
    assert len(left) == RECENT + PENDING + 1 and "driven" in left
    assert not any(i.startswith("old-") for i in left)
    assert report.sessions == RECENT + PENDING + 1
    assert report.oldest_ns == old  # the pending and the driven ones stay, as old as they are
    assert done_turns > 0 and (await store.summary("driven")).event_count > 3
    if pages_before is not None:  # SQLite: the freed pages went back to the file system
        after = pages(factory)
        assert after is not None and after[1] == 0
    again = await sweeper.sweep()  # nothing left to sweep
    assert again.sessions_swept == 0 and again.sessions == report.sessions


async def test_sqlite_gives_the_space_of_swept_sessions_back(tmp_path: Path) -> None:
    made = AgentFactory(build_runtime(Config(store="sqlite", data_dir=str(tmp_path))))
    try:
        await stored(made, [f"old-{i}" for i in range(1000)], time.time_ns() - 40 * DAY_NS)
        before = pages(made)
        report = await Sweeper(made, Retention(idle_session_days=30)).sweep()
        after = pages(made)
        assert report.sessions_swept == 1000
        assert before is not None and after is not None
        print(f"\nSQLite pages before the sweep {before[0]}, after {after[0]} (4 KiB each)")
        assert after[0] < before[0] / 2 and after[1] == 0
    finally:
        await made.close()
        await made.runtime.store.close()


def pages(factory: AgentFactory) -> tuple[int, int] | None:
    """A SQLite store's page count and free pages (None for another store)."""
    path = getattr(factory.runtime.store, "path", None)
    if path is None:
        return None
    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA page_count").fetchone()[0], db.execute(
            "PRAGMA freelist_count"
        ).fetchone()[0]


async def test_request_records_past_the_window_go_and_a_retry_inside_it_is_answered(
    factory: AgentFactory,
) -> None:
    store = factory.runtime.store
    await stored(factory, ["s"], time.time_ns())
    old = RequestRecord("a", "old", "SendMessage", b"old")
    await store.commit(Commit({"s": SessionWrites(requests=[old])}))
    await asyncio.sleep(1.2)
    new = RequestRecord("a", "new", "SendMessage", b"new")
    await store.commit(Commit({"s": SessionWrites(requests=[new])}))
    sweeper = Sweeper(factory, Retention(request_record_hours=1 / 3600, sweep_batch=1))
    report = await sweeper.sweep()
    assert report.requests_swept == 1 and report.sessions_swept == 0
    assert await store.find_request("a", "old") is None
    assert await store.find_request("a", "new") == new
    # A retry inside the window gets the first answer, not a second run.
    calls: list[str] = []

    async def run() -> bytes:
        calls.append("ran")
        return b"second"

    answer = await factory.runtime.requests.once("a", "new", "SendMessage", run)
    assert answer == b"new" and calls == []


async def test_one_sweeper_at_a_time_on_replicas(postgres_server: str) -> None:
    dsn = await fresh_database(postgres_server)
    first, second = PostgresStore(dsn), PostgresStore(dsn)
    try:
        assert await first.try_lease("retention-sweeper")
        assert not await second.try_lease("retention-sweeper")
        factory = AgentFactory(build_runtime(Config(store="postgres", postgres_dsn=dsn)))
        factory.runtime.store = second
        factory.catalogue.store = second
        assert not (await Sweeper(factory, Retention(idle_session_days=1)).sweep()).ran
        await first.close()  # its replica stops (or dies): the lock goes with its connection
        assert await second.try_lease("retention-sweeper")
        await second.release_lease("retention-sweeper")
    finally:
        await first.close()
        await second.close()
        await drop_database(postgres_server, dsn)


async def test_disposed_agents_sessions_go_n_days_after_the_disposal(
    factory: AgentFactory,
) -> None:
    store = factory.runtime.store
    now = time.time_ns()
    await stored(factory, ["disposed", "disposed-pending", "resumed", "live", "never-driven"], now)
    driven = (("a", "disposed"), ("p", "disposed-pending"), ("b", "resumed"), ("c", "live"))
    for agent_id, session_id in driven:
        agent = await factory.resume(agent_id, session_id, OPTIONS)
        agent.send(PROMPT)
        await agent.when_idle()
    before = time.time_ns()
    for agent_id in ("a", "p", "b"):
        await factory.dispose(agent_id)
    after = time.time_ns()
    disposed_at = (await store.summary("disposed")).disposed_ns
    assert before <= disposed_at <= after
    assert (await store.summary("live")).disposed_ns == 0
    assert (await store.summary("never-driven")).disposed_ns == 0
    # A resume clears the mark: the session is driven again.
    await factory.resume("b2", "resumed", OPTIONS)
    assert (await store.summary("resumed")).disposed_ns == 0
    # A message waits in this one (accepted for its agent by another path): it stays.
    await store.commit(
        Commit({"disposed-pending": SessionWrites(inbox_put=[
            InboxEntry(99, "message", ev.UserMessage(request_id="late"))
        ])})
    )  # fmt: skip
    assert (await store.summary("disposed-pending")).disposed_ns > 0

    rule = Retention(disposed_session_days=7)
    early = await Sweeper(factory, rule, clock=lambda: now + 6 * DAY_NS).sweep()
    assert early.sessions_swept == 0
    late = await Sweeper(factory, rule, clock=lambda: time.time_ns() + 8 * DAY_NS).sweep()
    assert late.sessions_swept == 1
    assert await store.list_ids() == [
        "disposed-pending", "live", "never-driven", "resumed"
    ]  # fmt: skip


async def test_a_format_5_sqlite_file_learns_disposals(tmp_path: Path) -> None:
    made = AgentFactory(build_runtime(Config(store="sqlite", data_dir=str(tmp_path))))
    await stored(made, ["s"], time.time_ns())
    path = made.runtime.store.path  # type: ignore[attr-defined]
    await made.runtime.store.close()
    with sqlite3.connect(path) as db:  # the file as format 5 wrote it
        db.execute("ALTER TABLE sessions DROP COLUMN disposed_ns")
        db.execute("UPDATE meta SET value = '5' WHERE key = 'format_version'")
    made = AgentFactory(build_runtime(Config(store="sqlite", data_dir=str(tmp_path))))
    try:
        store = made.runtime.store
        assert (await store.summary("s")).disposed_ns == 0
        await store.mark_disposed("s", 42)
        assert (await store.summary("s")).disposed_ns == 42
        kinds = [e.WhichOneof("payload") for e in (await store.load("s")).events]
        assert kinds == ["turn_start", "user_message", "turn_end"]
    finally:
        await made.close()
        await made.runtime.store.close()
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
    assert version == ("7",)


def test_the_config_names_the_rules(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "retention:\n  idleSessionDays: 30\n  disposedSessionDays: 7\n  requestRecordHours: 24\n"
    )
    retention = load_config(path).retention
    assert (
        retention.idle_session_days,
        retention.disposed_session_days,
        retention.request_record_hours,
    ) == (30, 7, 24)
    assert retention.on() and not Retention().on()
    assert Retention(disposed_session_days=1).on()
