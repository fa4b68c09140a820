"""Write ahead, then publish: group commits, the durable mark, bounded memory."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from agentloop.v1 import agent_pb2, scripted_pb2, session_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import AgentLoopError
from server.sessions.journal import Journal
from server.sessions.session import WINDOW, SessionLog
from server.stores import Commit, StoreConflict
from server.stores.memory import MemoryStore
from server.stores.sqlite import SqliteStore
from tests.harness import Harness, text_block
from tests.invariants import check_log
from tests.stores import append_events, create_session

TURN_START = ev.TurnStart(turn=1, trigger=ev.TRIGGER_KIND_MESSAGE)


async def new_session(journal: Journal, session_id: str) -> SessionLog:
    await create_session(journal.store, session_id, session_pb2.SessionHeader())
    return SessionLog(session_id, session_pb2.SessionHeader(), journal)


async def test_appends_of_one_tick_are_one_commit_and_published_after_it() -> None:
    journal = Journal(MemoryStore())
    a, b = await new_session(journal, "a"), await new_session(journal, "b")
    committed: list[int] = []
    a.committed_observers.append(lambda e: committed.append(e.seq))
    order: list[str] = []
    for seq in range(3):
        a.add(ev.StepEnd(turn=1, step=seq))
    b.add(TURN_START)
    journal.after_commit(lambda: order.append(f"callback after {a.stored} stored"))
    # Nothing is visible before the commit: not to readers, not to observers.
    assert (len(a), a.stored, committed) == (3, 0, [])
    assert await a.read(1, 10) == []
    await a.settle()
    assert journal.commits == 1
    assert (a.stored, b.stored, committed) == (3, 1, [1, 2, 3])
    assert order == ["callback after 3 stored"]
    assert [e.seq for e in await a.read(1, 10)] == [1, 2, 3]
    assert (await journal.store.load("a")).events == a.events


async def test_a_refused_session_fails_alone() -> None:
    store = MemoryStore()
    journal = Journal(store)
    good, bad = await new_session(journal, "good"), await new_session(journal, "bad")
    await append_events(store, "bad", [ev.SessionEvent(seq=1, turn_start=TURN_START)])
    bad.add(TURN_START)  # seq 1 again: another writer got there first
    good.add(TURN_START)
    await good.settle()
    assert good.stored == 1 and (await store.summary("good")).event_count == 1
    with pytest.raises(StoreConflict):
        await bad.settle()
    assert bad.stored == 0
    bad.add(ev.TurnEnd(turn=1))  # a failed session writes nowhere
    await journal.drain()
    assert (await store.summary("bad")).event_count == 1


class FlakyStore(MemoryStore):
    """A memory store whose first commits fail as a full disk would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def commit(self, commit: Commit) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("No space left on device")
        await super().commit(commit)


async def test_a_failing_store_is_retried_and_nothing_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyStore(failures=0)
    journal = Journal(store)
    session = await new_session(journal, "s")
    store.failures = 2
    session.add(TURN_START)
    await asyncio.wait_for(session.settle(), 5)
    assert session.stored == 1 and (await store.summary("s")).event_count == 1
    assert caplog.text.count("No space left on device") == 2


async def test_a_long_session_keeps_a_bounded_window_and_reads_the_rest_from_the_store(
    tmp_path: Path,
) -> None:
    chunks = 20_000
    step = scripted_pb2.ScriptedStep(text="x" * chunks, chunk_size=1)
    h = Harness(store=SqliteStore(tmp_path / "agentloop.db"), event_window=WINDOW)
    agent = await h.create(script=[step])
    agent.send([text_block("stream a lot")])
    await asyncio.wait_for(agent.when_idle(), 60)
    assert len(agent.session) > chunks
    gc.collect()
    in_memory = sum(1 for o in gc.get_objects() if type(o) is ev.SessionEvent)
    assert in_memory <= WINDOW + 16, in_memory  # the window, not the log
    assert len(agent.session.events) == WINDOW
    events = await agent.session.read(1, len(agent.session))
    assert [e.seq for e in events] == list(range(1, len(agent.session) + 1))
    check_log(events)
    paged = await agent.session.read(1, 5000, max_bytes=64 * 1024)
    assert 0 < len(paged) < 5000 and sum(e.ByteSize() for e in paged) <= 64 * 1024
    await h.factory.close()
    await h.runtime.store.close()


async def test_a_refused_commit_is_reported_to_the_waiters() -> None:
    store = MemoryStore()
    journal = Journal(store)
    session = await new_session(journal, "s")
    await append_events(store, "s", [ev.SessionEvent(seq=1, turn_start=TURN_START)])
    session.add(TURN_START)
    with pytest.raises(AgentLoopError, match="does not follow"):
        await session.settle()
    assert session.failure is not None


class WatchedStore(SqliteStore):
    """A SQLite store that records each commit it is asked for: per session, the sequence
    numbers of its events, and whether the commit was written or refused."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.commits: list[tuple[dict[str, list[int]], str]] = []

    async def commit(self, commit: Commit) -> None:
        seqs = {sid: [e.seq for e in w.events] for sid, w in commit.sessions.items()}
        try:
            await super().commit(commit)
        except StoreConflict:
            self.commits.append((seqs, "refused"))
            raise
        self.commits.append((seqs, "written"))

    def of(self, session_id: str, since: int = 0) -> list[tuple[list[int], str]]:
        """The commits from the `since`-th on that carried writes of `session_id`."""
        return [(seqs[session_id], how) for seqs, how in self.commits[since:] if session_id in seqs]


async def test_a_writer_fenced_off_by_a_takeover_stops_writing(tmp_path: Path) -> None:
    """Two servers on one file: the second resumes the session, the first can no longer write."""
    store = WatchedStore(tmp_path / "agentloop.db")
    first = Harness(store=store)
    agent = await first.create(session_id="s")
    agent.send([text_block("one two three")])
    await agent.when_idle()
    stored = len(agent.session)
    second = Harness(store=SqliteStore(tmp_path / "agentloop.db"))
    taken = await second.factory.resume("b", "s", agent_pb2.AgentOptions(tools=["word_count"]))
    second.created.append(taken)
    # The first server still thinks it drives "s"; its next turn is refused by the store.
    takeover = len(store.commits)
    agent.send([text_block("late words")])
    await agent.when_idle()
    assert isinstance(agent.session.failure, StoreConflict)
    errors = [e.error for e in first.agent_events["a1"] if e.HasField("error")]
    assert errors and "taken over" in errors[-1].message
    # What it tried to write for "s" after the takeover was refused, every time.
    attempts = store.of("s", takeover)
    assert attempts and {how for _, how in attempts} == {"refused"}, attempts
    assert attempts[0][0][0] == stored + 1  # the late turn's first event
    # Whatever it appends from now on goes nowhere: not one more commit for "s".
    agent.session.add(ev.TurnStart(turn=99, trigger=ev.TRIGGER_KIND_MESSAGE))
    await first.runtime.journal.drain()
    assert store.of("s", takeover) == attempts
    # The session holds what the first server wrote before the takeover, then the second's.
    taken.send([text_block("from the new owner")])
    await taken.when_idle()
    events = (await second.runtime.store.load("s")).events
    check_log(events)
    late = [e for e in events if e.HasField("user_message") and "late" in str(e)]
    assert late == [] and len(events) > stored
    await first.factory.close()
    await second.factory.close()
    await first.runtime.store.close()
    await second.runtime.store.close()


class GatedStore(MemoryStore):
    """A memory store whose commits, once `hold()` was called, wait for `release()`."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        """Set when a held commit arrived."""

    def hold(self) -> None:
        self.gate = asyncio.Event()

    def release(self) -> None:
        assert self.gate is not None
        self.gate.set()

    async def commit(self, commit: Commit) -> None:
        if self.gate is not None:
            self.entered.set()
            await self.gate.wait()
        await super().commit(commit)


async def test_a_wait_for_writes_dropped_with_a_refused_session_is_answered() -> None:
    """Writes queued behind a commit that the store refuses are dropped with the session;
    a wait for them ends with the refusal (it was left pending for ever)."""
    store = GatedStore()
    journal = Journal(store)
    session = await new_session(journal, "s")
    await append_events(store, "s", [ev.SessionEvent(seq=1, turn_start=TURN_START)])
    store.hold()
    session.add(TURN_START)  # seq 1 again: refused once it reaches the store
    await store.entered.wait()  # that commit is in flight
    session.add(ev.StepEnd(turn=1, step=0))  # pending behind it
    settled = asyncio.ensure_future(session.settle())
    refused = asyncio.Event()
    session.on_failure.append(lambda _: refused.set())
    store.release()
    await refused.wait()
    for _ in range(10):  # the answer takes a few passes of the loop (three), not a time
        if settled.done():
            break
        await asyncio.sleep(0)
    assert settled.done()
    with pytest.raises(StoreConflict):
        await settled


async def test_a_session_callback_waits_for_its_own_writes_only_and_keeps_its_order() -> None:
    store = GatedStore()  # a memory store would write each commit at once
    journal = Journal(store)
    a, b = await new_session(journal, "a"), await new_session(journal, "b")
    order: list[str] = []
    store.hold()
    b.add(TURN_START)  # another session's write is pending
    journal.after_commit(lambda: order.append(f"a clean, {a.stored} stored"), a)
    assert order == ["a clean, 0 stored"]  # nothing of a's to wait for: at once
    a.add(TURN_START)
    journal.after_commit(lambda: order.append(f"a first, {a.stored} stored"), a)
    await store.entered.wait()  # the commit of a and b is in flight now
    a.add(ev.StepEnd(turn=1, step=0))
    journal.after_commit(lambda: order.append(f"a second, {a.stored} stored"), a)
    assert order == ["a clean, 0 stored"]
    store.release()
    await a.settle()
    assert order == ["a clean, 0 stored", "a first, 1 stored", "a second, 2 stored"]
