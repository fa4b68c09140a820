"""Durable sessions through a real `python -m server` process and its SQLite file.

Every test starts the server as a subprocess on its own `--data-dir`, talks to it over
a real port, stops it with SIGTERM (or kills it), tampers with the data directory
while it is down when the scenario asks for it, and starts it again on the same
directory. Nothing is shared between tests; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2, session_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from server.models.scripted_options import script_options
from server.sessions.repair import INTERRUPTED_TEXT
from server.sessions.session import SessionLog, now_timestamp
from server.stores.sqlite import SqliteStore
from tests.e2e.conftest import READ_TIMEOUT, Client, EventStream, kinds, read_turn
from tests.invariants import check_log
from tests.processes import ServerProcess, server_process
from tests.stores import append_events

T = READ_TIMEOUT
"""The deadline of every unary call and of every wait on the server process."""
NO_AGENTS = "agents: []\n"
"""A config with no start-up agent, so the only sessions are the ones a test makes."""
PAGE = 7
"""A small page size, so that reading a log always crosses page boundaries."""


def word_count_options() -> agent_pb2.AgentOptions:
    """Unscripted: every turn calls word_count on the user's text, then answers."""
    return agent_pb2.AgentOptions(provider="scripted", model="m", tools=["word_count"])


# -- the server process ------------------------------------------------------------------


@dataclass
class Server(Client):
    """One running `python -m server` process and a client channel to it."""

    process: ServerProcess
    address: str

    def log(self) -> str:
        """The server's stderr so far."""
        return self.process.log()

    async def terminate(self) -> None:
        """SIGTERM, then wait (bounded) for a clean exit."""
        await self.channel.close()
        code = await self.process.terminate()
        assert code == 0, f"the server exited {code} after SIGTERM: {self.log()}"

    async def crash(self) -> None:
        """SIGKILL: no shutdown code runs, nothing more is flushed."""
        await self.process.kill()
        await self.channel.close()


def next_start_files(tmp_path: Path, config: str) -> tuple[Path, Path]:
    """(stderr log, config file) of the next start in `tmp_path`; writes the config."""
    n = len(list(tmp_path.glob("server-*.stderr")))
    config_path = tmp_path / f"config-{n}.yaml"
    config_path.write_text(config)
    return tmp_path / f"server-{n}.stderr", config_path


@contextlib.asynccontextmanager
async def running_server(tmp_path: Path, config: str = NO_AGENTS) -> AsyncIterator[Server]:
    """`python -m server` on `tmp_path/data`, on a port of its choosing; always killed.

    Each start writes the config to its own file and its stderr to its own log, so a
    test that restarts the server several times keeps every log for its messages.
    """
    stderr_path, config_path = next_start_files(tmp_path, config)
    async with server_process(
        "--config",
        str(config_path),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        str(tmp_path / "data"),
        stderr_path=stderr_path,
    ) as process:
        address = await process.listening_address()
        async with grpc.aio.insecure_channel(address) as channel:
            yield Server(channel=channel, process=process, address=address)


def db_path(tmp_path: Path) -> Path:
    """The SQLite file of the server started by `running_server(tmp_path)`."""
    return tmp_path / "data" / "agentloop.db"


# -- talking to it -----------------------------------------------------------------------


async def create(
    server: Server, agent_id: str, options: agent_pb2.AgentOptions | None = None
) -> str:
    """Create an agent; returns its session id."""
    response = await server.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id=agent_id, options=options or word_count_options()),
        timeout=T,
    )
    return response.agent.session_id


async def resume(
    server: Server, agent_id: str, session_id: str, options: agent_pb2.AgentOptions | None = None
) -> None:
    """Resume `agent_id` on a stored session."""
    response = await server.factory.ResumeAgent(
        fac.ResumeAgentRequest(
            agent_id=agent_id, session_id=session_id, options=options or word_count_options()
        ),
        timeout=T,
    )
    assert response.agent.session_id == session_id


async def run_turn(server: Server, agent_id: str, text: str) -> list[ev.SessionEvent]:
    """Send a message and return the events of the turn that answers it, once stored.

    The agent stays `running` until its turn-end write settles, so waiting for idle
    after the `turn_end` means the turn is on disk.
    """
    sent = await server.agents.SendMessage(
        api.SendMessageRequest(agent_id=agent_id, text=text), timeout=T
    )
    events = await read_turn(server.agents, agent_id, sent.next_seq)
    assert events[0].seq == sent.next_seq
    await wait_idle(server, agent_id)
    return events


async def run_next_turn(
    server: Server, agent_id: str, session_id: str, text: str, *, turn: int, first_seq: int
) -> None:
    """Run a turn that must be turn `turn`, complete, start at seq `first_seq`, and leave
    the session's whole log well-formed."""
    events = await run_turn(server, agent_id, text)
    assert turn_number(events) == turn and reason(events[-1]) == "completed"
    assert events[0].seq == first_seq
    check_log(await list_events(server, session_id))


async def stored_one_turn_session(tmp_path: Path) -> str:
    """Start the server, store a session of agent a1 with one completed turn, stop the
    server; returns the session id."""
    async with running_server(tmp_path) as server:
        session_id = await create(server, "a1")
        await run_turn(server, "a1", "one two")
        await server.terminate()
    return session_id


async def wait_idle(server: Server, agent_id: str) -> None:
    """WaitIdle, bounded; fails if the agent did not become idle."""
    request = api.WaitIdleRequest(agent_id=agent_id)
    request.timeout.FromSeconds(int(T))
    response = await server.agents.WaitIdle(request, timeout=T + 1)
    assert response.idle


async def list_events(server: Server, session_id: str) -> list[ev.SessionEvent]:
    """Every event of a session, read through ListSessionEvents a small page at a time."""
    events: list[ev.SessionEvent] = []
    token = ""
    while True:
        page = await server.agents.ListSessionEvents(
            api.ListSessionEventsRequest(session_id=session_id, page_size=PAGE, page_token=token),
            timeout=T,
        )
        events.extend(page.events)
        token = page.next_page_token
        if not token:
            return events


async def get_session(server: Server, session_id: str) -> session_pb2.Session:
    """GetSession by session id."""
    response = await server.agents.GetSession(
        api.GetSessionRequest(session_id=session_id), timeout=T
    )
    return response.session


async def list_sessions(server: Server) -> dict[str, session_pb2.Session]:
    """Every session ListSessions returns (all pages), by id."""
    sessions: dict[str, session_pb2.Session] = {}
    token = ""
    while True:
        page = await server.agents.ListSessions(
            api.ListSessionsRequest(page_size=2, page_token=token), timeout=T
        )
        sessions.update((s.session_id, s) for s in page.sessions)
        token = page.next_page_token
        if not token:
            return sessions


async def status_of(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """Await a call that must fail; returns its error."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


# -- reading logs ------------------------------------------------------------------------


def as_bytes(events: Sequence[ev.SessionEvent]) -> list[bytes]:
    """Each event serialized: equal lists mean byte-identical logs.

    Deterministically: a `request_header` carries tool schemas as `Struct`s, which are
    protobuf maps, and protobuf does not fix the wire order of map entries (a server
    process may re-serialize a loaded event with its map entries in another order).
    The deterministic form sorts them, so equal bytes still mean equal events, field
    for field, with no unknown or lost fields.
    """
    return [e.SerializeToString(deterministic=True) for e in events]


def derived(
    events: Sequence[ev.SessionEvent], header: session_pb2.SessionHeader
) -> list[c.Message]:
    """The history the server's own code derives from `events`."""
    return SessionLog("derived", header, seed=events).derive_messages()


@dataclass(frozen=True)
class Request:
    """What a client can rebuild of one step's model request from the log alone."""

    turn: int
    step: int
    messages: list[c.Message]
    """The derived history before the step's `step_start`."""
    header: c.RequestHeader | None
    """The latest `request_header` logged before the step ended."""


def rebuilt_requests(events: Sequence[ev.SessionEvent]) -> list[Request]:
    """One `Request` per `step_start` of the log."""
    requests: list[Request] = []
    empty = session_pb2.SessionHeader()
    for index, event in enumerate(events):
        if not event.HasField("step_start"):
            continue
        end = next(
            (j for j in range(index, len(events)) if events[j].HasField("step_end")), len(events)
        )
        headers = [e.request_header.header for e in events[:end] if e.HasField("request_header")]
        requests.append(
            Request(
                turn=event.step_start.turn,
                step=event.step_start.step,
                messages=derived(events[:index], empty),
                header=headers[-1] if headers else None,
            )
        )
    return requests


def reason(event: ev.SessionEvent) -> str:
    """The end reason of a `turn_end`."""
    assert event.HasField("turn_end"), event
    return str(event.turn_end.reason.WhichOneof("kind"))


def turn_number(events: Sequence[ev.SessionEvent]) -> int:
    """The number of the turn whose events these are (they start with `turn_start`)."""
    assert events[0].HasField("turn_start"), kinds(list(events))
    return events[0].turn_start.turn


# -- 1. round trip across a restart ------------------------------------------------------


async def test_three_turns_survive_a_restart_and_the_fourth_continues(tmp_path: Path) -> None:
    texts = ["one two three", "four five", "six seven eight nine"]
    async with running_server(tmp_path) as server:
        session_id = await create(server, "a1")
        for number, text in enumerate(texts, start=1):
            turn = await run_turn(server, "a1", text)
            assert turn_number(turn) == number
            assert reason(turn[-1]) == "completed"
        before = await list_events(server, session_id)
        described = await get_session(server, session_id)
        await server.terminate()

    n = len(before)
    assert [e.seq for e in before] == list(range(1, n + 1))
    assert described.event_count == n and described.turn_count == 3
    check_log(before)

    async with running_server(tmp_path) as server:
        # The stored log, read before any agent loads it, is byte-identical.
        assert as_bytes(await list_events(server, session_id)) == as_bytes(before)
        await resume(server, "again", session_id)
        resumed = await get_session(server, session_id)
        assert resumed.agent_id == "again"
        assert (resumed.event_count, resumed.turn_count) == (n, 3)
        assert resumed.header == described.header

        fourth = await run_turn(server, "again", "ten eleven")
        after = await list_events(server, session_id)
        await server.terminate()

    # (a) the first N events did not change by a byte.
    assert as_bytes(after[:n]) == as_bytes(before)
    # (b) numbering continues: turn 4, seq N onwards, no gaps, no duplicates.
    assert turn_number(fourth) == 4 and reason(fourth[-1]) == "completed"
    assert fourth[0].seq == n + 1
    assert [e.seq for e in after] == list(range(1, len(after) + 1))
    assert as_bytes(after[n:]) == as_bytes(fourth)
    check_log(after)
    new_headers = [e.request_header for e in after[n:] if e.HasField("request_header")]
    assert new_headers, kinds(after[n:])
    assert new_headers[0].reason == ev.HEADER_REASON_RESUME
    # (c) the derived history survived the restart...
    history = derived(before, described.header)
    assert derived(after[:n], resumed.header) == history
    # ... and so did every step's request as a client rebuilds it from the log.
    old_requests = rebuilt_requests(before)
    assert len(old_requests) == 6  # word_count, then the answer, in each of 3 turns
    assert rebuilt_requests(after)[: len(old_requests)] == old_requests
    first_new = rebuilt_requests(after)[len(old_requests)]
    assert (first_new.turn, first_new.step) == (4, 1)
    assert first_new.messages[: len(history)] == history
    assert [m.content[0].text.text for m in first_new.messages[len(history) :]] == ["ten eleven"]
    # The same options give the same model config and tools after the restart.
    old_header, new_header = old_requests[-1].header, first_new.header
    assert old_header is not None and new_header is not None
    assert new_header.config == old_header.config
    assert list(new_header.tools) == list(old_header.tools)


# -- 2. crashes --------------------------------------------------------------------------


def sleeper_options() -> agent_pb2.AgentOptions:
    """Turn 1 answers in text; turn 2 calls `sleep` for a minute."""
    sleep = scripted_pb2.ScriptedToolCall(id="c1", name="sleep", arguments='{"seconds": 60}')
    return agent_pb2.AgentOptions(
        provider="scripted",
        model="m",
        tools=["sleep", "word_count"],
        provider_options=script_options(
            [
                scripted_pb2.ScriptedStep(text="the first answer"),
                scripted_pb2.ScriptedStep(tool_calls=[sleep]),
            ]
        ),
    )


async def stored_log(tmp_path: Path, session_id: str) -> list[ev.SessionEvent]:
    """What the SQLite file holds for a session, read in-process (server stopped)."""
    store = SqliteStore(db_path(tmp_path))
    try:
        events = (await store.load(session_id)).events
    finally:
        await store.close()
    return events


async def test_sigkill_mid_tool_keeps_every_seen_event_and_repairs_the_turn(
    tmp_path: Path,
) -> None:
    async with running_server(tmp_path) as server:
        session_id = await create(server, "sleeper", sleeper_options())
        first = await run_turn(server, "sleeper", "answer me")
        assert turn_number(first) == 1 and reason(first[-1]) == "completed"

        sent = await server.agents.SendMessage(
            api.SendMessageRequest(agent_id="sleeper", text="now sleep"), timeout=T
        )
        with EventStream(server.agents, agent_id="sleeper", from_seq=0) as stream:
            call = await stream.until("tool_call")
            seen = list(stream.events)
        assert (call.tool_call.turn, call.tool_call.name) == (2, "sleep")
        assert sent.next_seq == len(first) + first[0].seq
        await server.crash()

    # Every event is stored before anyone sees it: the file holds everything the
    # stream delivered, byte for byte, the open turn 2 included.
    on_disk = await stored_log(tmp_path, session_id)
    assert as_bytes(on_disk[: len(seen)]) == as_bytes(seen)
    assert kinds(on_disk)[-1] == "tool_call"

    async with running_server(tmp_path) as server:
        listed = await list_sessions(server)
        assert session_id in listed and not listed[session_id].load_error

        await resume(server, "back", session_id)
        reloaded = await list_events(server, session_id)
        assert as_bytes(reloaded[: len(seen)]) == as_bytes(seen)
        # The turn open at the crash is closed on load as the reference says.
        assert kinds(reloaded)[len(seen) :] == ["tool_result", "step_end", "turn_end"]
        interrupted = reloaded[len(seen)].tool_result
        assert interrupted.call_id == call.tool_call.call_id and interrupted.is_error
        assert interrupted.error.name == "InterruptedError"
        assert reason(reloaded[-1]) == "interrupted"
        check_log(reloaded)

        # The next turn is numbered after the interrupted one, and completes.
        await run_next_turn(
            server, "back", session_id, "are you there", turn=3, first_seq=len(reloaded) + 1
        )
        await server.terminate()


async def write_open_tail(tmp_path: Path, session_id: str) -> list[ev.SessionEvent]:
    """Append an open turn to a stored session, as a crash mid-tool would leave it.

    The tail is what the loop logs up to a running tool call: `turn_start`, the
    user's message, `step_start`, the model's message asking for the call, and the
    `tool_call`; no result, no `step_end`, no `turn_end`. Returns the tail.
    """
    store = SqliteStore(db_path(tmp_path))
    try:
        events = (await store.load(session_id)).events
        turn = max(e.turn_start.turn for e in events if e.HasField("turn_start")) + 1
        seq = len(events) + 1  # seqs start at 1
        surface = ev.SurfaceOp(kind=ev.SURFACE_OP_KIND_APPEND)
        call = c.ToolCallBlock(id="c7", name="sleep", arguments='{"seconds": 60}')
        payloads: list[dict[str, Any]] = [
            {
                "turn_start": ev.TurnStart(
                    turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE, source=c.Source(kind="user")
                )
            },
            {
                "user_message": ev.UserMessage(
                    content=[c.ContentBlock(text=c.TextBlock(text="sleep on it"))],
                    source=c.Source(kind="user"),
                ),
                "surface_op": surface,
            },
            {"step_start": ev.StepStart(turn=turn, step=1)},
            {
                "assistant_message": ev.AssistantMessage(
                    turn=turn, step=1, content=[c.ContentBlock(tool_call=call)]
                ),
                "surface_op": surface,
            },
            {
                "tool_call": ev.ToolCall(
                    turn=turn, step=1, call_id="c7", name="sleep", arguments=call.arguments
                )
            },
        ]
        tail = [
            ev.SessionEvent(seq=seq + i, create_time=now_timestamp(), **payload)
            for i, payload in enumerate(payloads)
        ]
        await append_events(store, session_id, tail)
    finally:
        await store.close()
    return tail


def check_closed_as_interrupted(
    closers: Sequence[ev.SessionEvent], tail: Sequence[ev.SessionEvent]
) -> None:
    """The repair of `tail`: a synthetic error result for c7, step_end, turn_end."""
    turn = tail[0].turn_start.turn
    assert kinds(list(closers)) == ["tool_result", "step_end", "turn_end"]
    result = closers[0].tool_result
    assert (result.turn, result.step, result.call_id) == (turn, 1, "c7")
    assert result.is_error
    assert (result.error.name, result.error.code) == ("InterruptedError", "interrupted")
    assert result.content[0].text.text == INTERRUPTED_TEXT
    assert list(closers[0].source_event_seqs) == [tail[-1].seq]
    assert (closers[1].step_end.turn, closers[1].step_end.step) == (turn, 1)
    assert closers[2].turn_end.turn == turn and reason(closers[2]) == "interrupted"
    assert [e.seq for e in closers] == [tail[-1].seq + 1 + i for i in range(3)]


async def test_a_stored_open_turn_is_closed_interrupted_and_the_repair_is_stored(
    tmp_path: Path,
) -> None:
    async with running_server(tmp_path) as server:
        session_id = await create(server, "a1")
        await run_turn(server, "a1", "one two")
        flushed = await list_events(server, session_id)
        await server.terminate()
    tail = await write_open_tail(tmp_path, session_id)
    stored = len(flushed) + len(tail)
    turn = tail[0].turn_start.turn
    assert turn == 2

    async with running_server(tmp_path) as server:
        # Listing reads each stored session whole, so it already repairs the tail.
        assert (await list_sessions(server))[session_id].event_count == stored + 3
        described = await get_session(server, session_id)
        assert (described.event_count, described.turn_count) == (stored + 3, turn)
        repaired = await list_events(server, session_id)
        assert as_bytes(repaired[:stored]) == as_bytes([*flushed, *tail])
        check_closed_as_interrupted(repaired[stored:], tail)
        check_log(repaired)
        # The repair was written: the listing (stored counts) already shows it.
        assert (await list_sessions(server))[session_id].event_count == stored + 3
        history = derived(repaired, described.header)
        assert history[-1].content[0].tool_result.tool_call_id == "c7"
        assert history[-1].content[0].tool_result.is_error
        await server.terminate()

    assert as_bytes(await stored_log(tmp_path, session_id)) == as_bytes(repaired)

    async with running_server(tmp_path) as server:
        # A second restart reads the repaired log as it was: no second repair.
        assert as_bytes(await list_events(server, session_id)) == as_bytes(repaired)
        await resume(server, "back", session_id)
        await run_next_turn(
            server, "back", session_id, "wake up", turn=turn + 1, first_seq=len(repaired) + 1
        )
        await server.terminate()


async def test_concurrent_reads_of_a_crashed_session_repair_it_once(tmp_path: Path) -> None:
    session_id = await stored_one_turn_session(tmp_path)
    tail = await write_open_tail(tmp_path, session_id)
    stored = tail[-1].seq  # the stored count: seqs start at 1

    async with running_server(tmp_path) as server:
        # Three readers load the unrepaired session at once: each must see it closed,
        # and the closers must be stored once. (Today each load computes the closers
        # from what it read and appends them: the first append wins, the others fail
        # the store's "does not follow" check and answer DATA_LOSS for a healthy,
        # already repaired session; see AgentFactory.load in server/lifecycle/factory.py.)
        results = await asyncio.gather(
            get_session(server, session_id),
            get_session(server, session_id),
            list_events(server, session_id),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, [
            (e.code(), e.details()) if isinstance(e, grpc.aio.AioRpcError) else e for e in errors
        ]
        first, second, events = results
        assert isinstance(first, session_pb2.Session) and isinstance(second, session_pb2.Session)
        assert first.event_count == second.event_count == stored + 3
        assert isinstance(events, list)
        check_closed_as_interrupted(events[stored:], tail)
        assert (await list_sessions(server))[session_id].event_count == stored + 3
        await server.terminate()
    check_log(await stored_log(tmp_path, session_id))


# -- 3. idle injection -------------------------------------------------------------------


async def test_an_idle_injection_turn_survives_a_restart(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        session_id = await create(server, "a1")
        await run_turn(server, "a1", "one two")
        mark = (await get_session(server, session_id)).event_count
        injected = await server.agents.InjectContext(
            api.InjectContextRequest(agent_id="a1", text="the build is green"), timeout=T
        )
        assert injected.next_seq == mark + 4
        await server.terminate()  # disposal drains the injection's background flush

    async with running_server(tmp_path) as server:
        await resume(server, "again", session_id)
        events = await list_events(server, session_id)
        tail = events[mark:]
        assert kinds(tail) == ["turn_start", "context_message", "turn_end"]
        assert tail[0].turn_start.turn == 2
        assert tail[0].turn_start.trigger == ev.TRIGGER_KIND_INJECTION
        assert tail[1].context_message.content[0].text.text == "the build is green"
        assert tail[2].turn_end.turn == 2 and reason(tail[2]) == "completed"
        history = derived(events, (await get_session(server, session_id)).header)
        assert "the build is green" in history[-1].content[0].text.text

        await run_next_turn(
            server, "again", session_id, "three four", turn=3, first_seq=len(events) + 1
        )
        await server.terminate()


# -- 4. fork -----------------------------------------------------------------------------


async def test_fork_at_a_turn_end_and_resume_the_fork(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        session_id = await create(server, "a1")
        await run_turn(server, "a1", "one two")
        await run_turn(server, "a1", "three four five")
        source = await list_events(server, session_id)
        ends = [e.seq for e in source if e.HasField("turn_end")]
        assert len(ends) == 2
        before = await list_sessions(server)

        # Refused forks name the field and change nothing.
        not_end = await status_of(
            server.agents.ForkSession(
                api.ForkSessionRequest(session_id=session_id, boundary_seq=ends[0] - 1), timeout=T
            )
        )
        assert not_end.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "boundary_seq" in (not_end.details() or "")
        out_of_range = await status_of(
            server.agents.ForkSession(
                api.ForkSessionRequest(session_id=session_id, boundary_seq=len(source) + 1),
                timeout=T,
            )
        )
        assert out_of_range.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "boundary_seq" in (out_of_range.details() or "")
        unknown = await status_of(
            server.agents.ForkSession(api.ForkSessionRequest(session_id="nobody"), timeout=T)
        )
        assert unknown.code() == grpc.StatusCode.NOT_FOUND
        assert await list_sessions(server) == before

        forked = await server.agents.ForkSession(
            api.ForkSessionRequest(
                session_id=session_id, boundary_seq=ends[0], new_session_id="what-if"
            ),
            timeout=T,
        )
        fork = forked.session
        assert fork.session_id == "what-if" and not fork.agent_id
        assert fork.header.parent_session_id == session_id
        assert fork.header.seed_length == ends[0] == fork.event_count  # seqs start at 1
        assert fork.turn_count == 1
        assert as_bytes(await list_events(server, "what-if")) == as_bytes(source[: ends[0]])
        taken = await status_of(
            server.agents.ForkSession(
                api.ForkSessionRequest(session_id=session_id, new_session_id="what-if"), timeout=T
            )
        )
        assert taken.code() == grpc.StatusCode.ALREADY_EXISTS

        # Unset boundary: the last turn_end.
        latest = await server.agents.ForkSession(
            api.ForkSessionRequest(session_id=session_id), timeout=T
        )
        assert latest.session.header.seed_length == len(source)
        assert latest.session.session_id.startswith(f"{session_id}-fork-")

        await resume(server, "b", "what-if")
        nxt = await run_turn(server, "b", "six")
        assert turn_number(nxt) == 2 and nxt[0].seq == ends[0] + 1
        assert reason(nxt[-1]) == "completed"
        await server.terminate()

    async with running_server(tmp_path) as server:
        # The fork and its parent are stored apart: the fork's turn 2 is its own.
        fork = await get_session(server, "what-if")
        assert fork.header.parent_session_id == session_id
        assert fork.turn_count == 2
        assert as_bytes(await list_events(server, session_id)) == as_bytes(source)
        await server.terminate()


# -- 5. damage ---------------------------------------------------------------------------


async def two_sessions_one_corrupted(tmp_path: Path) -> tuple[str, str]:
    """Store two one-turn sessions, then overwrite one event row of the second with junk.

    Returns (healthy session id, damaged session id). The server is stopped.
    """
    async with running_server(tmp_path) as server:
        healthy = await create(server, "healthy")
        damaged = await create(server, "damaged")
        await run_turn(server, "healthy", "one two")
        await run_turn(server, "damaged", "three four")
        await server.terminate()

    def corrupt() -> None:
        with contextlib.closing(sqlite3.connect(db_path(tmp_path))) as db:
            cursor = db.execute(  # the row holding event 2 (a row holds a run of events)
                "UPDATE events SET event = ?2 WHERE session_id = ?1 AND seq ="
                " (SELECT MAX(seq) FROM events WHERE session_id = ?1 AND seq <= 2)",
                (damaged, b"\xff\xff garbage \xff\xff"),
            )
            assert cursor.rowcount == 1
            db.commit()

    await asyncio.to_thread(corrupt)
    return healthy, damaged


async def test_a_corrupted_row_is_data_loss_for_that_session_only(tmp_path: Path) -> None:
    healthy, damaged = await two_sessions_one_corrupted(tmp_path)

    async with running_server(tmp_path) as server:
        assert await server.health() == health_pb2.HealthCheckResponse.SERVING
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: get_session(server, damaged),
            lambda: list_events(server, damaged),
            lambda: resume(server, "d2", damaged),
        ]
        for call in calls:
            error = await status_of(call())
            assert error.code() == grpc.StatusCode.DATA_LOSS, error.details()
            assert damaged in (error.details() or "")
        # The refused resume published nothing.
        agents = await server.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
        assert not agents.agents

        await resume(server, "h2", healthy)
        nxt = await run_turn(server, "h2", "five six")
        assert turn_number(nxt) == 2 and reason(nxt[-1]) == "completed"
        assert server.process.returncode is None
        await server.terminate()


async def test_a_corrupted_row_is_listed_with_its_load_error(tmp_path: Path) -> None:
    healthy, damaged = await two_sessions_one_corrupted(tmp_path)

    async with running_server(tmp_path) as server:
        listed = await list_sessions(server)
        assert set(listed) == {healthy, damaged}
        assert not listed[healthy].load_error
        assert listed[healthy].event_count > 0
        # README: "A session that cannot be read ... is listed with its load_error"
        # (GetSession and ResumeAgent of it answer DATA_LOSS, tested above). Today the
        # listing reads only the stored header and counts (AgentFactory.describe uses
        # store.summary), so a damaged event row is listed as healthy.
        assert listed[damaged].load_error, listed[damaged]
        await server.terminate()


async def test_a_log_that_lost_its_last_rows_is_data_loss_not_an_interrupted_turn(
    tmp_path: Path,
) -> None:
    async with running_server(tmp_path) as server:
        session_id = await create(server, "a1")
        await run_turn(server, "a1", "one two")
        await run_turn(server, "a1", "three four")
        await server.terminate()

    def cut_last_row() -> int:
        with contextlib.closing(sqlite3.connect(db_path(tmp_path))) as db:
            seq, count = db.execute(  # the last commit's row: a run of events
                "SELECT seq, count FROM events WHERE session_id = ? ORDER BY seq DESC LIMIT 1",
                (session_id,),
            ).fetchone()
            db.execute("DELETE FROM events WHERE session_id = ? AND seq = ?", (session_id, seq))
            db.commit()
            return int(count)

    cut = await asyncio.to_thread(cut_last_row)
    async with running_server(tmp_path) as server:
        for call in (
            get_session(server, session_id),
            list_events(server, session_id),
            resume(server, "a2", session_id),
        ):
            error = await status_of(call)
            assert error.code() == grpc.StatusCode.DATA_LOSS, error.details()
            assert f"its last {cut} events are missing" in (error.details() or "")
        listed = await list_sessions(server)
        assert "missing" in listed[session_id].load_error
        await server.terminate()


def truncate_to_half(db: Path) -> None:
    """Drop the WAL files of a cleanly closed database, then cut the file in half."""
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    size = db.stat().st_size
    assert size >= 4 * 4096, size  # several pages, so that whole pages go
    os.truncate(db, size // 2)


async def test_a_truncated_database_does_not_stop_the_server(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        session_id = await create(server, "a1")
        for i in range(3):
            await run_turn(server, "a1", f"word{i} " * 400)
        await server.terminate()
    truncate_to_half(db_path(tmp_path))

    async with running_server(tmp_path) as server:
        assert await server.health() == health_pb2.HealthCheckResponse.SERVING
        # Every call answers with a status; a store failure is DATA_LOSS naming the file.
        calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("ListSessions", lambda: list_sessions(server)),
            ("GetSession", lambda: get_session(server, session_id)),
            ("CreateAgent", lambda: create(server, "fresh")),
            ("ListSessions", lambda: list_sessions(server)),
        ]
        for name, call in calls:
            try:
                await call()
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.DATA_LOSS, (name, error)
                details = error.details() or ""
                assert "agentloop.db" in details or session_id in details, (name, details)
        assert server.process.returncode is None
        assert await server.health() == health_pb2.HealthCheckResponse.SERVING
        await server.terminate()


# -- 6. config-driven resume -------------------------------------------------------------


async def test_a_config_agent_resumes_a_stored_session(tmp_path: Path) -> None:
    session_id = await stored_one_turn_session(tmp_path)

    resuming = (
        "agents:\n"
        "  - id: back\n"
        "    provider: scripted\n"
        "    model: m\n"
        "    tools: [word_count]\n"
        f"    resumeSessionId: {session_id}\n"
    )
    async with running_server(tmp_path, resuming) as server:
        agent = await server.factory.GetAgent(fac.GetAgentRequest(agent_id="back"), timeout=T)
        assert agent.agent.session_id == session_id
        nxt = await run_turn(server, "back", "three four")
        assert turn_number(nxt) == 2 and reason(nxt[-1]) == "completed"
        await server.terminate()

    missing = (
        "agents:\n"
        "  - id: back\n"
        "    resumeSessionId: no-such-session\n"
        "  - id: fresh\n"
        "    tools: [word_count]\n"
    )
    async with running_server(tmp_path, missing) as server:
        assert await server.health() == health_pb2.HealthCheckResponse.SERVING
        log = server.log()
        assert "back was not started" in log and "no-such-session" in log, log
        gone = await status_of(
            server.factory.GetAgent(fac.GetAgentRequest(agent_id="back"), timeout=T)
        )
        assert gone.code() == grpc.StatusCode.NOT_FOUND
        await server.factory.GetAgent(fac.GetAgentRequest(agent_id="fresh"), timeout=T)
        assert session_id in await list_sessions(server)
        await server.terminate()


# -- 7. no persistent store --------------------------------------------------------------


async def test_resume_is_refused_without_a_persistent_store(tmp_path: Path) -> None:
    async with running_server(tmp_path, "store: memory\nagents: []\n") as server:
        session_id = await create(server, "a1")
        await run_turn(server, "a1", "one two")
        await server.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="a1"), timeout=T)
        for target in (session_id, "never-existed"):
            error = await status_of(
                server.factory.ResumeAgent(
                    fac.ResumeAgentRequest(
                        agent_id="again", session_id=target, options=word_count_options()
                    ),
                    timeout=T,
                )
            )
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
            assert "persistent" in (error.details() or "")
        await server.terminate()
    assert not db_path(tmp_path).exists()
