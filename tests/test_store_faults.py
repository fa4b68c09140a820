"""The write-ahead promises when the store misbehaves: outages, refusals, slow commits.

Faults are injected where no real one can be made on demand: a memory store whose
commits fail like a full disk, and SQLite's write function raising the error SQLite
raises when the disk is full.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agentloop.v1 import agent_service_pb2 as pb
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.edge.api_agent import AgentServicer
from server.kernel.errors import FailedPrecondition, NotFound
from server.sessions.journal import Journal
from server.sessions.session import SessionLog
from server.stores import FIRST_SEQ, Commit, SessionWrites, StoreConflict, sqlite_sql
from server.stores import sqlite as sqlite_store
from server.stores.memory import MemoryStore
from server.stores.sqlite import SqliteStore
from tests.harness import Harness, text_block, text_step
from tests.stores import append_events, create_session

TURN_START = ev.TurnStart(turn=1, trigger=ev.TRIGGER_KIND_MESSAGE)


class OutageStore(MemoryStore):
    """A memory store whose commits fail while `down`, as a store with a full disk."""

    def __init__(self) -> None:
        super().__init__(persistent=True)
        self.down = False

    async def commit(self, commit: Commit) -> None:
        if self.down:
            raise OSError("No space left on device")
        await super().commit(commit)


async def test_a_transient_sqlite_error_is_retried_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "agentloop.db")
    await store.open()
    await create_session(store, "s", session_pb2.SessionHeader())
    session = SessionLog("s", session_pb2.SessionHeader(), Journal(store))
    real = sqlite_sql.write_commit
    failures = [sqlite3.OperationalError("database or disk is full")] * 2

    def full_disk(db: sqlite3.Connection, rows: Any) -> None:
        if failures:
            raise failures.pop()
        real(db, rows)

    monkeypatch.setattr(sqlite_store, "write_commit", full_disk)
    session.add(TURN_START)
    await asyncio.wait_for(session.settle(), 5)
    assert session.failure is None and not failures
    assert (await store.summary("s")).event_count == 1
    await store.close()


class OutageAfterRefusal(MemoryStore):
    """The group is refused (one session is unknown); the next commit meets an outage."""

    def __init__(self) -> None:
        super().__init__(persistent=True)
        self.commits = 0

    async def commit(self, commit: Commit) -> None:
        self.commits += 1
        if self.commits == 2:  # the first per-session retry, after the refusal
            raise OSError("I/O error")
        await super().commit(commit)


async def test_an_outage_after_a_refusal_is_retried_never_reported_durable() -> None:
    store = OutageAfterRefusal()
    journal = Journal(store)
    await super(OutageAfterRefusal, store).commit(
        Commit({"good": SessionWrites(create=session_pb2.SessionHeader())})
    )
    good = SessionLog("good", session_pb2.SessionHeader(), journal)
    missing = SessionLog("missing", session_pb2.SessionHeader(), journal)  # never created
    good.add(TURN_START)
    missing.add(TURN_START)
    await asyncio.wait_for(good.settle(), 5)
    assert store.commits >= 3  # refused whole, outage alone, then stored
    assert (await store.summary("good")).event_count == 1 and good.stored == 1
    assert isinstance(missing.failure, NotFound)


async def test_a_retry_after_the_client_gave_up_waits_for_the_first_call() -> None:
    store = OutageStore()
    h = Harness(store=store)
    agent = await h.create("r", script=[text_step("a"), text_step("b")])
    servicer = AgentServicer(h.factory)
    request = pb.SendMessageRequest(agent_id="r", text="pay the invoice", request_id="rid-1")
    store.down = True  # the commit is slow: the client's deadline passes
    first = asyncio.ensure_future(servicer.SendMessage(request, None))
    await asyncio.sleep(0.1)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    retry = asyncio.ensure_future(servicer.SendMessage(request, None))
    await asyncio.sleep(0.1)
    store.down = False
    await asyncio.wait_for(retry, 10)
    await asyncio.wait_for(agent.when_idle(), 10)
    events = await agent.session.read(0, 10_000)
    recorded = [e for e in events if e.user_message.request_id == "rid-1"]
    assert len(recorded) == 1
    await h.factory.close()


async def test_an_agent_whose_session_was_taken_stops_and_refuses_calls() -> None:
    store = MemoryStore(persistent=True)
    h = Harness(store=store)
    agent = await h.create("z", script=[text_step("a"), text_step("b")])
    await h.turn(agent, "first")
    stored = (await store.summary(agent.session.session_id)).event_count
    # Another writer appends behind the agent's back.
    late = ev.SessionEvent(seq=stored + FIRST_SEQ, turn_start=ev.TurnStart(turn=9))
    await append_events(store, agent.session.session_id, [late])
    agent.send([text_block("second")])
    with pytest.raises(StoreConflict):
        await agent.session.settle()
    await asyncio.wait_for(agent.when_idle(), 5)
    with pytest.raises(FailedPrecondition):
        agent.send([text_block("third")])
    for _ in range(100):  # the factory stops it in the background
        if agent.disposed:
            break
        await asyncio.sleep(0.01)
    assert agent.disposed
    with pytest.raises(FailedPrecondition):  # stopped: it answers as a disposed agent
        h.factory.get("z")
    await h.factory.close()


class SlowAdoption(MemoryStore):
    """Adoption takes a while, as on SQLite, where it runs on the writer thread."""

    async def adopt_pending(self, agent_id: str, session_id: str) -> Any:
        await asyncio.sleep(0.05)
        return await super().adopt_pending(agent_id, session_id)


async def test_no_message_reaches_an_agent_before_its_creation_is_done() -> None:
    store = SlowAdoption(persistent=True)
    h = Harness(store=store)
    agent = await h.create("cfg", script=[text_step("x")] * 3)
    agent.session.accept(
        "message", ev.UserMessage(content=[text_block("old")], request_id="old")
    )  # left pending, as by a shutdown
    await agent.session.settle()
    await h.factory.close()
    h2 = Harness(store=store)
    start = asyncio.ensure_future(h2.factory.create("cfg", agent.options, adopt_pending=True))
    for _ in range(1000):
        await asyncio.sleep(0)
        if "cfg" in h2.factory.agents:
            break
    assert not start.done()
    with pytest.raises(NotFound):  # what an RPC sees while the creation awaits the store
        h2.factory.get("cfg")
    with pytest.raises(FailedPrecondition):
        h2.factory.agents["cfg"].send([text_block("new")])
    created = await start
    created.send([text_block("new")], request_id="new")
    await asyncio.wait_for(created.when_idle(), 10)
    events = await created.session.read(0, 10_000)
    assert [e.user_message.request_id for e in events if e.HasField("user_message")] == [
        "old",
        "new",
    ]
    await h2.factory.close()
