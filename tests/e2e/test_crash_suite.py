"""The crash suite: a loaded server SIGKILLed at random points, then checked.

One data directory lives through many cycles. In each cycle a real `python -m server`
starts, the agents of earlier cycles are resumed (their pending messages run), the
whole store is checked against everything the clients saw and were told, and then a
concurrent load runs (slow chunks, sleeping and parallel tool calls, sends, steering,
injections, cancels, forks, creations, live streams) until the server is SIGKILLed at
a random moment. After each restart:

- every event any client saw is stored, byte for byte;
- every message whose call returned OK is recorded exactly once (as a user, steering
  or context message, a blocked prompt or a dropped message): in a stored turn, or
  pending and then run; no request id is ever recorded twice;
- a fork is absent or complete, and every acknowledged fork exists;
- every session satisfies the log invariants, and its next turn numbers correctly.

It runs on SQLite and on PostgreSQL. `AGENTLOOP_CRASH_POINTS` sets the number of kills
on SQLite (default 30), `AGENTLOOP_CRASH_POINTS_POSTGRES` on PostgreSQL (default 10);
`AGENTLOOP_CRASH_SEED` replays one random schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import uuid
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.models.scripted_options import script_options
from tests.e2e.crash_diagnostics import CallHistory, explain_missing
from tests.e2e.test_durability import Server, T, running_server
from tests.invariants import check_log
from tests.postgres import fresh_database

CRASH_POINTS = int(os.environ.get("AGENTLOOP_CRASH_POINTS", "30"))
CRASH_POINTS_POSTGRES = int(os.environ.get("AGENTLOOP_CRASH_POINTS_POSTGRES", "10"))
SEED = int(os.environ.get("AGENTLOOP_CRASH_SEED", str(random.randrange(1 << 30))))
RECORDING_KINDS = (
    "user_message",
    "steering_message",
    "context_message",
    "prompt_blocked",
    "message_dropped",
)
"""The events that record an accepted message (and carry its request id)."""


def millis(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(nanos=ms * 1_000_000)


def busy_script(rng: random.Random) -> list[scripted_pb2.ScriptedStep]:
    """Many model calls of mixed shapes: slow text, sleeping and parallel tool calls."""
    steps = []
    for k in range(300):
        shape = rng.randrange(4)
        if shape == 0:
            steps.append(
                scripted_pb2.ScriptedStep(
                    text=f"slow answer {k}", chunk_size=3, chunk_delay=millis(4)
                )
            )
        elif shape == 1:
            call = scripted_pb2.ScriptedToolCall(name="sleep", arguments='{"seconds": 0.03}')
            steps.append(scripted_pb2.ScriptedStep(text="sleeping", tool_calls=[call]))
        elif shape == 2:
            calls = [
                scripted_pb2.ScriptedToolCall(name="sleep", arguments='{"seconds": 0.02}'),
                scripted_pb2.ScriptedToolCall(name="echo", arguments='{"text": "a"}'),
                scripted_pb2.ScriptedToolCall(name="sleep", arguments='{"seconds": 0.01}'),
            ]
            steps.append(scripted_pb2.ScriptedStep(tool_calls=calls))
        else:
            steps.append(scripted_pb2.ScriptedStep(text=f"quick {k}", chunk_size=5))
    return steps


@dataclass
class World:
    """What the clients know: agents, what they saw, what they were told was accepted."""

    rng: random.Random
    agents: dict[str, str] = field(default_factory=dict)
    """Acknowledged agents and their session ids."""
    options: dict[str, agent_pb2.AgentOptions] = field(default_factory=dict)
    seen: dict[str, dict[int, bytes]] = field(default_factory=dict)
    """Per session: every event a stream delivered, by seq."""
    accepted: dict[str, set[str]] = field(default_factory=dict)
    """Per agent: request ids of calls that returned OK."""
    retries: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """Per agent: (method, request id) of calls that failed; sent again next cycle."""
    forks: set[str] = field(default_factory=set)
    """Acknowledged forks."""
    kills: int = 0
    histories: dict[str, CallHistory] = field(default_factory=dict)
    """Per request id: every call made with it (for the report of a failed check)."""
    tmp_path: Path | None = None
    dsn: str | None = None
    """The PostgreSQL store, if that is the store (else SQLite under `tmp_path`)."""

    def options_for(self, agent_id: str) -> agent_pb2.AgentOptions:
        if agent_id not in self.options:
            self.options[agent_id] = agent_pb2.AgentOptions(
                provider="scripted",
                model="m",
                tools=["sleep", "echo", "word_count"],
                provider_options=script_options(busy_script(self.rng)),
            )
        return self.options[agent_id]


@pytest.mark.timeout(60 + 10 * CRASH_POINTS)
async def test_sigkill_at_random_points_loses_nothing_seen_or_accepted(tmp_path: Path) -> None:
    await crash_cycles(tmp_path, "", CRASH_POINTS)


@pytest.mark.timeout(60 + 10 * CRASH_POINTS_POSTGRES)
async def test_the_same_on_postgres(tmp_path: Path, postgres_server: str) -> None:
    dsn = await fresh_database(postgres_server)
    config = f"store: postgres\npostgresDsn: '{dsn}'\nleaseSeconds: 1\n"
    await crash_cycles(tmp_path, config, CRASH_POINTS_POSTGRES, dsn=dsn)


CONFIG_AGENT = "cfg"
"""A config agent: it starts on a fresh session at each start, with its pending messages."""


async def crash_cycles(tmp_path: Path, config: str, points: int, dsn: str | None = None) -> None:
    """Start, check, load, kill: `points` times, then a last start and check."""
    world = World(random.Random(SEED), tmp_path=tmp_path, dsn=dsn)
    config += f"agents:\n  - id: {CONFIG_AGENT}\n    tools: [word_count]\n"
    for cycle in range(points + 1):
        async with running_server(tmp_path, config) as server:
            await resume_all(server, world)
            await verify(server, world, cycle)
            if cycle == points:
                await server.terminate()
                break
            if cycle == 0:
                await create_agent(server, world, f"agent-{cycle}")
            await load_until_killed(server, world, cycle)
    assert world.kills == points, f"seed {SEED}"
    # The load was real: the checks above had something to check.
    seen = sum(len(events) for events in world.seen.values())
    accepted = sum(len(ids) for ids in world.accepted.values())
    print(f"crash suite: {world.kills} kills, {seen} events seen, {accepted} messages accepted,"
          f" {len(world.forks)} forks, {len(world.agents)} agents, seed {SEED}")  # fmt: skip
    assert seen > 0 and accepted > 0


# -- one cycle ---------------------------------------------------------------------------


async def create_agent(server: Server, world: World, agent_id: str) -> None:
    response = await server.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id=agent_id, options=world.options_for(agent_id)), timeout=T
    )
    world.agents[agent_id] = response.agent.session_id


async def resume_all(server: Server, world: World) -> None:
    """Resume every acknowledged agent; its pending messages run; wait until idle.

    Over PostgreSQL the dead server's leases hold its agents until they expire; then
    the new server takes them over by itself (or a resume gets them).
    """
    for agent_id, session_id in world.agents.items():
        request = fac.ResumeAgentRequest(
            agent_id=agent_id, session_id=session_id, options=world.options_for(agent_id)
        )
        for _ in range(100):
            try:
                await server.factory.ResumeAgent(request, timeout=T)
                break
            except grpc.aio.AioRpcError as error:
                held = (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION)
                if error.code() not in held:
                    raise
            with contextlib.suppress(grpc.aio.AioRpcError):
                await server.factory.GetAgent(fac.GetAgentRequest(agent_id=agent_id), timeout=T)
                break  # taken over here
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"{agent_id} never came back (seed {SEED})")
    for _ in range(100):  # the config agent: created at start, or taken over at expiry
        with contextlib.suppress(grpc.aio.AioRpcError):
            await server.factory.GetAgent(fac.GetAgentRequest(agent_id=CONFIG_AGENT), timeout=T)
            break
        await asyncio.sleep(0.1)
    for agent_id in [*world.agents, CONFIG_AGENT]:
        idle = await server.agents.WaitIdle(
            api.WaitIdleRequest(agent_id=agent_id, timeout=duration_pb2.Duration(seconds=20)),
            timeout=T + 20,
        )
        assert idle.idle, f"{agent_id} did not settle after the restart (seed {SEED})"


async def load_until_killed(server: Server, world: World, cycle: int) -> None:
    """Run the load for a random while, then SIGKILL the server mid-flight."""
    stop = asyncio.Event()
    config_session = await server.agents.GetSession(
        api.GetSessionRequest(agent_id=CONFIG_AGENT), timeout=T
    )
    live = {**world.agents, CONFIG_AGENT: config_session.session.session_id}
    workers = [
        *(stream_worker(server, world, a, s) for a, s in live.items()),
        *(message_worker(server, world, a, stop, cycle) for a in live),
        fork_worker(server, world, stop),
        create_worker(server, world, cycle, stop),
    ]
    tasks = [asyncio.ensure_future(w) for w in workers]
    await asyncio.sleep(world.rng.uniform(0.05, 0.6))
    await server.process.kill()  # the crash: no shutdown code runs
    world.kills += 1
    stop.set()
    await asyncio.gather(*tasks)
    await server.channel.close()


async def tolerant(call: Awaitable[object]) -> object | None:
    """Await a call; None when it failed (the server may die at any moment)."""
    try:
        return await call
    except grpc.aio.AioRpcError:
        return None


async def stream_worker(server: Server, world: World, agent_id: str, session_id: str) -> None:
    """Follow the agent's session from its start; record every event delivered."""
    seen = world.seen.setdefault(session_id, {})
    call = server.agents.StreamSessionEvents(
        api.StreamSessionEventsRequest(agent_id=agent_id, from_seq=0)
    )
    try:
        async for batch in call:
            for event in batch.events:
                seen[event.seq] = event.SerializeToString(deterministic=True)
    except grpc.aio.AioRpcError:
        pass  # the server died: what was delivered so far is recorded


def message_call(server: Server, agent_id: str, method: str, request_id: str) -> Awaitable[object]:
    """One mutating call with a request id."""
    if method == "SendMessage":
        return server.agents.SendMessage(
            api.SendMessageRequest(agent_id=agent_id, text="go", request_id=request_id),
            timeout=T,
        )
    if method == "SteerMessage":
        return server.agents.SteerMessage(
            api.SteerMessageRequest(agent_id=agent_id, text="steer", request_id=request_id),
            timeout=T,
        )
    return server.agents.InjectContext(
        api.InjectContextRequest(agent_id=agent_id, text="ctx", request_id=request_id),
        timeout=T,
    )


async def message_worker(
    server: Server, world: World, agent_id: str, stop: asyncio.Event, cycle: int
) -> None:
    """Retry what failed before, then send, steer, inject and cancel at random.

    A call that fails (the server died around it) is sent again, with its request id,
    after the restart: if the first one was stored the retry gets its answer,
    otherwise the retry runs it; either way it must be recorded exactly once.
    """
    accepted = world.accepted.setdefault(agent_id, set())
    retries = world.retries.setdefault(agent_id, [])
    rng = random.Random(world.rng.random())
    while not stop.is_set():
        retry = bool(retries)
        if retries:
            method, request_id = retries.pop(0)
        else:
            method = rng.choices(
                ["SendMessage", "SteerMessage", "InjectContext", "CancelTurn"], [50, 20, 15, 15]
            )[0]
            request_id = str(uuid.uuid4())
        if method == "CancelTurn":
            await tolerant(
                server.agents.CancelTurn(
                    api.CancelTurnRequest(agent_id=agent_id, reason="crash test"), timeout=T
                )
            )
        else:
            history = world.histories.setdefault(request_id, CallHistory(agent_id))
            outcome = await outcome_of(message_call(server, agent_id, method, request_id))
            history.calls.append((cycle, method, f"{'retry' if retry else 'call'} {outcome}"))
            if outcome != "OK":
                retries.append((method, request_id))
                return  # the server is gone (or going)
            accepted.add(request_id)
        await asyncio.sleep(rng.uniform(0, 0.03))


async def outcome_of(call: Awaitable[object]) -> str:
    """OK, or the status code of the failed call."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code().name
    return "OK"


async def create_worker(server: Server, world: World, cycle: int, stop: asyncio.Event) -> None:
    """Create an agent now and then, during the load; record the ones acknowledged."""
    rng = random.Random(world.rng.random())
    for n in range(3):
        await asyncio.sleep(rng.uniform(0.02, 0.3))
        if stop.is_set():
            return
        agent_id = f"agent-{cycle}-{n}"
        created = await tolerant(
            server.factory.CreateAgent(
                fac.CreateAgentRequest(agent_id=agent_id, options=world.options_for(agent_id)),
                timeout=T,
            )
        )
        if isinstance(created, fac.CreateAgentResponse):
            world.agents[agent_id] = created.agent.session_id


async def fork_worker(server: Server, world: World, stop: asyncio.Event) -> None:
    """Fork sessions now and then; record the forks acknowledged."""
    rng = random.Random(world.rng.random())
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.02, 0.15))
        source = rng.choice(sorted(world.agents.values()))
        fork_id = f"fork-{uuid.uuid4()}"
        done = await tolerant(
            server.agents.ForkSession(
                api.ForkSessionRequest(session_id=source, new_session_id=fork_id), timeout=T
            )
        )
        if done is not None:
            world.forks.add(fork_id)


async def read_log(server: Server, session_id: str) -> list[ev.SessionEvent]:
    """Every stored event of a session, in large pages."""
    events: list[ev.SessionEvent] = []
    token = ""
    while True:
        page = await server.agents.ListSessionEvents(
            api.ListSessionEventsRequest(session_id=session_id, page_size=5000, page_token=token),
            timeout=T,
        )
        events.extend(page.events)
        token = page.next_page_token
        if not token:
            return events


# -- the checks --------------------------------------------------------------------------


async def verify(server: Server, world: World, cycle: int) -> None:
    """Everything seen is stored; everything accepted recorded once; forks whole."""
    where = f"(cycle {cycle}, seed {SEED})"
    logs: dict[str, list[ev.SessionEvent]] = {}
    listed = await server.agents.ListSessions(api.ListSessionsRequest(page_size=1000), timeout=T)
    for session in listed.sessions:
        assert not session.load_error, f"{session.session_id}: {session.load_error} {where}"
        logs[session.session_id] = await read_log(server, session.session_id)
    for session_id, events in logs.items():
        check_log(events)
        stored = {e.seq: e.SerializeToString(deterministic=True) for e in events}
        for seq, seen in world.seen.get(session_id, {}).items():
            assert stored.get(seq) == seen, f"{session_id}: event {seq} seen but not stored {where}"
    for agent_id, accepted in world.accepted.items():
        sessions = sessions_of(agent_id, world, logs)
        ids = Counter(r for session_id in sessions for r in recorded_ids(logs[session_id]))
        duplicates = {r for r, n in ids.items() if n > 1}
        assert not duplicates, f"{agent_id}: recorded twice: {duplicates} {where}"
        missing = accepted - set(ids)
        if missing:
            assert world.tmp_path is not None
            report = await explain_missing(
                world.tmp_path,
                None if world.dsn else world.tmp_path / "data" / "agentloop.db",
                world.dsn,
                agent_id,
                missing,
                world.histories,
            )
            raise AssertionError(f"{agent_id}: accepted but never recorded {where}:{report}")
    by_id = {s.session_id: s for s in listed.sessions}
    assert world.forks <= set(by_id), f"acknowledged forks missing {where}"
    for session in listed.sessions:
        parent = session.header.parent_session_id
        if not parent:
            continue
        seed = session.header.seed_length
        fork_log = logs[session.session_id]
        assert len(fork_log) >= seed > 0, f"partial fork {session.session_id} {where}"
        source = [e.SerializeToString(deterministic=True) for e in logs[parent][:seed]]
        copy = [e.SerializeToString(deterministic=True) for e in fork_log[:seed]]
        assert copy == source, f"fork {session.session_id} differs from its source {where}"
    for agent_id, session_id in world.agents.items():
        await next_turn_numbers_correctly(server, agent_id, logs[session_id])


def sessions_of(agent_id: str, world: World, logs: dict[str, list[ev.SessionEvent]]) -> list[str]:
    """The sessions an agent drove: its one session, or every session of the config agent."""
    if agent_id == CONFIG_AGENT:
        return [s for s in logs if s.startswith(f"{CONFIG_AGENT}-session-")]
    return [world.agents[agent_id]]


def recorded_ids(events: list[ev.SessionEvent]) -> list[str]:
    """The request ids on the events that record accepted messages."""
    return [
        getattr(e, e.WhichOneof("payload") or "").request_id
        for e in events
        if e.WhichOneof("payload") in RECORDING_KINDS
        and getattr(e, e.WhichOneof("payload") or "").request_id
    ]


async def next_turn_numbers_correctly(
    server: Server, agent_id: str, events: list[ev.SessionEvent]
) -> None:
    """An idle inject opens the next turn: one past the highest stored."""
    before = max((e.turn_start.turn for e in events if e.HasField("turn_start")), default=0)
    sent = await server.agents.InjectContext(
        api.InjectContextRequest(agent_id=agent_id, text="check"), timeout=T
    )
    page = await server.agents.ListSessionEvents(
        api.ListSessionEventsRequest(agent_id=agent_id, from_seq=len(events) + 1), timeout=T
    )
    starts = [e.turn_start.turn for e in page.events if e.HasField("turn_start")]
    assert starts and starts[0] == before + 1, (starts, before)
    assert sent.next_seq > len(events)
