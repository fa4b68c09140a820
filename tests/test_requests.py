"""Request ids: a new id costs no store read while its agent lives; a used one is found."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.kernel.errors import AgentLoopError, InvalidArgument
from server.sessions import requests
from server.sessions.journal import Journal
from server.sessions.requests import Requests
from server.sessions.session import SessionLog
from server.stores import Commit, RequestRecord, SessionWrites
from server.stores.memory import MemoryStore
from tests.stores import create_session


class CountingStore(MemoryStore):
    """A memory store that counts the reads of request records."""

    def __init__(self) -> None:
        super().__init__(persistent=True)
        self.finds = 0
        self.listings = 0

    async def find_request(self, agent_id: str, request_id: str) -> RequestRecord | None:
        self.finds += 1
        return await super().find_request(agent_id, request_id)

    async def request_ids(self, agent_id: str, limit: int) -> list[str] | None:
        self.listings += 1
        return await super().request_ids(agent_id, limit)


class Owner:
    """Stands for a live agent: the calls of one agent id go to it while it lives."""


async def store_with_session() -> CountingStore:
    store = CountingStore()
    await create_session(store, "s", session_pb2.SessionHeader())
    return store


def recording(
    store: MemoryStore, agent_id: str, request_id: str, answer: bytes
) -> Callable[[], Coroutine[Any, Any, bytes]]:
    """A call's run: records its answer in the store, as the API does with its message."""

    async def run() -> bytes:
        record = RequestRecord(agent_id, request_id, "SendMessage", answer)
        await store.commit(Commit({"s": SessionWrites(requests=[record])}))
        return answer

    return run


async def test_new_ids_of_a_live_agent_read_no_request_record() -> None:
    store = await store_with_session()
    calls = Requests(store)
    owner = Owner()
    for i in range(5):
        run = recording(store, "a", f"r{i}", b"%d" % i)
        assert await calls.once("a", f"r{i}", "SendMessage", run, owner) == b"%d" % i
    assert store.listings == 1  # the agent's stored ids, once
    assert store.finds == 1  # only the first call, made while they were being read
    again = recording(store, "a", "r3", b"second")
    assert await calls.once("a", "r3", "SendMessage", again, owner) == b"3"


async def test_an_id_stored_before_the_agent_went_live_here_is_found() -> None:
    store = await store_with_session()
    await recording(store, "a", "old", b"first")()
    calls = Requests(store)  # a restart: nothing in memory
    owner = Owner()
    new = await calls.once("a", "new", "SendMessage", recording(store, "a", "new", b"n"), owner)
    old = await calls.once("a", "old", "SendMessage", recording(store, "a", "old", b"x"), owner)
    assert (new, old) == (b"n", b"first")
    with pytest.raises(InvalidArgument, match="was used for SendMessage"):
        await calls.once("a", "old", "SteerMessage", recording(store, "a", "old", b"x"), owner)


async def test_a_new_live_agent_reads_the_ids_again() -> None:
    store = await store_with_session()
    calls = Requests(store)
    first = Owner()
    await calls.once("a", "r1", "SendMessage", recording(store, "a", "r1", b"1"), first)
    await calls.once("a", "r2", "SendMessage", recording(store, "a", "r2", b"2"), first)
    # The agent moves (another replica records an id meanwhile) and comes back as a new
    # live object: its ids are read again, so the one recorded elsewhere is found.
    await recording(store, "a", "elsewhere", b"e")()
    second = Owner()
    await calls.once("a", "r3", "SendMessage", recording(store, "a", "r3", b"3"), second)
    answer = await calls.once(
        "a", "elsewhere", "SendMessage", recording(store, "a", "elsewhere", b"x"), second
    )
    assert answer == b"e"
    assert store.listings == 2


async def test_a_failed_call_leaves_its_id_to_the_store() -> None:
    store = await store_with_session()
    calls = Requests(store)
    owner = Owner()
    await calls.once("a", "r0", "SendMessage", recording(store, "a", "r0", b"0"), owner)

    async def record_then_fail() -> bytes:
        await recording(store, "a", "r1", b"stored")()
        raise RuntimeError("the commit's answer was lost")

    with pytest.raises(RuntimeError):
        await calls.once("a", "r1", "SendMessage", record_then_fail, owner)
    finds = store.finds
    answer = await calls.once("a", "r1", "SendMessage", recording(store, "a", "r1", b"x"), owner)
    assert answer == b"stored" and store.finds == finds + 1


async def test_ids_that_do_not_fit_are_looked_up_in_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(requests, "KNOWN_IDS", 2)
    store = await store_with_session()
    calls = Requests(store)
    owner = Owner()
    for i in range(4):
        await calls.once("a", f"r{i}", "SendMessage", recording(store, "a", f"r{i}", b"a"), owner)
    finds = store.finds
    await calls.once("a", "r9", "SendMessage", recording(store, "a", "r9", b"a"), owner)
    assert store.finds == finds + 1  # past the budget: every new id is looked up
    again = await calls.once("a", "r1", "SendMessage", recording(store, "a", "r1", b"b"), owner)
    assert again == b"a"


async def test_without_an_owner_every_new_id_is_looked_up() -> None:
    store = await store_with_session()
    calls = Requests(store)
    for i in range(3):
        await calls.once("a", f"r{i}", "SendMessage", recording(store, "a", f"r{i}", b"a"))
    assert store.finds == 3 and store.listings == 0


class GatedStore(CountingStore):
    """A store whose commits wait while `gate` is closed: a commit that is slow."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def commit(self, commit: Commit) -> None:
        await self.gate.wait()
        await super().commit(commit)


async def journaled(store: MemoryStore) -> SessionLog:
    await create_session(store, "s", session_pb2.SessionHeader())
    if isinstance(store, GatedStore):
        store.gate.clear()  # from now on, each commit waits for the test
    return SessionLog("s", session_pb2.SessionHeader(), Journal(store))


def accepting(session: SessionLog, request_id: str, accepted: list[str]) -> Callable[[], bytes]:
    """A call accepted at once: its answer recorded in the session's next commit."""

    def accept() -> bytes:
        accepted.append(request_id)
        session.add(ev.TurnStart(turn=len(accepted), trigger=ev.TRIGGER_KIND_MESSAGE))
        answer = b"answer %d" % len(accepted)
        session.record(RequestRecord("a", request_id, "SendMessage", answer))
        return answer

    return accept


def sender(
    calls: Requests, session: SessionLog, accepted: list[str]
) -> Callable[[], Coroutine[Any, Any, bytes]]:
    """A SendMessage with request id "r1" of agent "a" (one owner), accepted into `session`."""
    owner = Owner()

    def send() -> Coroutine[Any, Any, bytes]:
        accept = accepting(session, "r1", accepted)
        return calls.accept_once("a", "r1", "SendMessage", accept, session, owner)

    return send


async def test_a_duplicate_waits_for_the_first_calls_commit_and_gets_its_answer() -> None:
    store = GatedStore()
    session = await journaled(store)
    calls, accepted = Requests(store), list[str]()
    send = sender(calls, session, accepted)

    first, duplicate = asyncio.ensure_future(send()), asyncio.ensure_future(send())
    await asyncio.sleep(0.01)
    assert not first.done() and not duplicate.done()  # neither answers before the commit
    store.gate.set()
    assert await first == await duplicate == b"answer 1"
    assert accepted == ["r1"] and session.stored == 1


async def test_a_first_call_that_gives_up_leaves_its_commit_to_the_retry() -> None:
    store = GatedStore()
    session = await journaled(store)
    calls, accepted = Requests(store), list[str]()
    send = sender(calls, session, accepted)

    with pytest.raises(TimeoutError):  # its deadline passed while the commit was slow
        await asyncio.wait_for(send(), 0.01)
    retry = asyncio.ensure_future(send())
    await asyncio.sleep(0.01)
    assert not retry.done()  # waits for the same commit: nothing accepted again
    store.gate.set()
    assert await retry == b"answer 1" and accepted == ["r1"]
    assert await send() == b"answer 1" and accepted == ["r1"]  # answered from memory


async def test_a_refused_commit_is_every_callers_error_and_a_retry_runs_again() -> None:
    store = CountingStore()
    session = await journaled(store)
    calls, accepted = Requests(store), list[str]()
    session.fence = 7  # the store knows no such claim: it refuses the commit
    send = sender(calls, session, accepted)

    first, duplicate = asyncio.ensure_future(send()), asyncio.ensure_future(send())
    results = await asyncio.gather(first, duplicate, return_exceptions=True)
    assert all(isinstance(r, AgentLoopError) for r in results), results
    assert accepted == ["r1"]
