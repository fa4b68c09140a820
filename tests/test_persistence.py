"""Durable sessions through the factory: flush, resume after restart, crash tails, fork."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentloop.v1 import agent_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import FailedPrecondition, InvalidArgument, NotFound
from server.stores.memory import MemoryStore
from server.stores.sqlite import SqliteStore
from tests.harness import Harness, kinds, reason_kinds, text_step, tool_step
from tests.invariants import check_log
from tests.stores import append_events

OPTIONS = agent_pb2.AgentOptions(provider="scripted", model="m", tools=["word_count"])


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "agentloop.db"


async def restart(db: Path) -> Harness:
    """A new runtime over the same file: what a server restart sees."""
    return Harness(store=SqliteStore(db))


async def test_every_turn_is_stored_when_the_agent_goes_idle(db: Path) -> None:
    h = Harness(store=SqliteStore(db))
    agent = await h.create(session_id="s", tools=["word_count"])
    await h.turn(agent, "one two")
    stored = (await h.runtime.store.load("s")).events
    assert stored == agent.session.events
    await h.factory.close()
    await h.runtime.store.close()


async def test_resume_after_restart_continues_history_and_requests(db: Path) -> None:
    h = Harness(store=SqliteStore(db))
    agent = await h.create(session_id="s", tools=["word_count"])
    await h.turn(agent, "first message")
    await h.turn(agent, "second message")
    history = agent.session.derive_messages()
    before = list(agent.session.events)
    await h.factory.close()
    await h.runtime.store.close()

    h2 = await restart(db)
    resumed = await h2.factory.resume("again", "s", OPTIONS)
    h2.created.append(resumed)
    assert resumed.session.events == before
    assert resumed.session.derive_messages() == history
    await h2.turn(resumed, "third message")
    events = resumed.session.events
    check_log(events)
    assert [e.turn_start.turn for e in events if e.HasField("turn_start")] == [1, 2, 3]
    reasons = [e.request_header.reason for e in events if e.HasField("request_header")]
    assert reasons == [ev.HEADER_REASON_INITIAL, ev.HEADER_REASON_RESUME]
    # The first request after the restart extends the history of before it.
    assert list(h2.model.requests[0].messages[: len(history)]) == history
    await h2.factory.close()
    await h2.runtime.store.close()


async def test_a_crash_tail_is_closed_as_interrupted_and_persisted(db: Path) -> None:
    store = SqliteStore(db)
    h = Harness(store=store)
    agent = await h.create(session_id="s", tools=["word_count"])
    await h.turn(agent, "done turn")
    stored = len(agent.session)
    # What a crash during a tool call leaves: a turn, a step and a call, never flushed
    # by the loop. Write them as the store would have them after a partial flush.
    session = agent.session
    tail = [
        ev.SessionEvent(seq=stored + 1, turn_start=ev.TurnStart(turn=2)),
        ev.SessionEvent(seq=stored + 2, step_start=ev.StepStart(turn=2, step=1)),
        ev.SessionEvent(
            seq=stored + 3, tool_call=ev.ToolCall(turn=2, step=1, call_id="x", name="sleep")
        ),
    ]
    await h.factory.close()
    await append_events(store, "s", tail)
    await store.close()

    h2 = await restart(db)
    resumed = await h2.factory.resume("again", "s", OPTIONS)
    h2.created.append(resumed)
    assert kinds(resumed)[stored:] == [
        "turn_start", "step_start", "tool_call", "tool_result", "step_end", "turn_end"
    ]  # fmt: skip
    assert reason_kinds(resumed)[-1] == "interrupted"
    on_disk = (await h2.runtime.store.load("s")).events
    assert len(on_disk) == len(resumed.session)  # the repair itself was stored
    await h2.turn(resumed, "after the crash")
    assert resumed.session.max_turn == 3
    assert session.session_id == "s"
    await h2.factory.close()
    await h2.runtime.store.close()


async def test_resume_errors(harness: Harness) -> None:
    with pytest.raises(NotFound):
        await harness.factory.resume("a", "missing", OPTIONS)
    ephemeral = Harness(store=MemoryStore())
    await ephemeral.create(session_id="s")
    await ephemeral.factory.dispose("a1")
    with pytest.raises(FailedPrecondition, match="no persistent session store"):
        await ephemeral.factory.resume("a", "s", OPTIONS)


async def test_fork_at_a_turn_end_continues_numbering(harness: Harness) -> None:
    agent = await harness.create(session_id="src", script=[text_step("1"), text_step("2")])
    await harness.turn(agent, "one")
    await harness.turn(agent, "two")
    first_end = next(e.seq for e in agent.session.events if e.HasField("turn_end"))
    fork = await harness.factory.catalogue.fork("src", first_end, "child")
    assert fork.header.parent_session_id == "src"
    assert fork.header.seed_length == first_end
    assert fork.event_count == first_end
    resumed = await harness.factory.resume("forked", "child", OPTIONS)
    harness.created.append(resumed)
    await harness.turn(resumed, "from the fork")
    turns = [e.turn_start.turn for e in resumed.session.events if e.HasField("turn_start")]
    assert turns == [1, 2]


async def test_fork_boundaries_are_checked(harness: Harness) -> None:
    agent = await harness.create(session_id="src", script=[text_step("1")])
    await harness.turn(agent, "one")
    with pytest.raises(
        InvalidArgument, match="^boundary_seq: event 2 is a user_message, not a turn_end"
    ):
        await harness.factory.catalogue.fork("src", 2)
    with pytest.raises(InvalidArgument, match="out of range"):
        await harness.factory.catalogue.fork("src", 10_000)
    default = await harness.factory.catalogue.fork("src", None)
    assert default.event_count == len(agent.session)
    with pytest.raises(NotFound):
        await harness.factory.catalogue.fork("nope", None)
    empty = await harness.create("idle", session_id="empty")
    with pytest.raises(InvalidArgument, match="has no turn_end"):
        await harness.factory.catalogue.fork("empty", None)
    assert empty.session.session_id == "empty"


async def test_list_sessions_includes_stored_and_damaged(db: Path) -> None:
    h = Harness(store=SqliteStore(db))
    agent = await h.create(session_id="a", script=[tool_step(("word_count", '{"text":"x"}'))],
                           tools=["word_count"])  # fmt: skip
    await h.turn(agent, "go")
    await h.factory.dispose("a1")
    await h.create("b1", session_id="b")
    sessions = {
        i: await h.factory.catalogue.describe(i) for i in await h.factory.catalogue.session_ids()
    }
    assert set(sessions) == {"a", "b"}
    assert sessions["a"].event_count == len(agent.session) and sessions["a"].agent_id == ""
    assert sessions["b"].agent_id == "b1"
    await h.factory.close()
    await h.runtime.store.close()


async def test_resume_without_options_restores_the_stored_ones(db: Path) -> None:
    h = Harness(store=SqliteStore(db))
    agent = await h.create(session_id="s", tools=["word_count"], model="m", persona="terse")
    created = agent_pb2.AgentOptions()
    created.CopyFrom(agent.options)
    await h.factory.close()
    await h.runtime.store.close()

    h2 = await restart(db)
    resumed = await h2.factory.resume("again", "s", None)
    h2.created.append(resumed)
    assert resumed.options == created and list(resumed.options.tools) == ["word_count"]
    await h2.factory.dispose("again")
    # Options given at resume replace the stored ones, and are stored in their turn.
    other = agent_pb2.AgentOptions(provider="scripted", model="n")
    replaced = await h2.factory.resume("third", "s", other)
    h2.created.append(replaced)
    assert replaced.options == other
    assert (await h2.runtime.store.load("s")).options == other
    await h2.factory.close()
    await h2.runtime.store.close()


async def test_resuming_a_live_session_says_what_to_do(harness: Harness) -> None:
    await harness.create(session_id="live")
    with pytest.raises(FailedPrecondition, match='live agent "a1".*DisposeAgent'):
        await harness.factory.resume("other", "live", None)
