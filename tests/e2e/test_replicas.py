"""Replicas over one PostgreSQL: three real server processes, a real embedded PostgreSQL.

Any replica answers any call (calls for an agent go to its owner); a stream on any
replica sees every event once, in order; when an owner dies another takes its agents
over after the lease time, closes the turn the crash left open and runs the pending
messages once; a paused owner that comes back is fenced off; racing creations have one
winner.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.retrying import retried, retry_delay
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.models.scripted_options import script_options
from server.stores import FIRST_SEQ
from tests.e2e.conftest import EventStream, kinds
from tests.e2e.test_crash_suite import read_log as read_log  # shared by the replica tests
from tests.e2e.test_durability import Server, T, running_server
from tests.invariants import check_log
from tests.postgres import fresh_database
from tests.processes import PluginLauncher, guard_example

LEASE = 1
"""Seconds a replica owns its agents without renewing (short, so failover is quick)."""


@contextlib.asynccontextmanager
async def replicas(
    tmp_path: Path, postgres_server: str, count: int = 3, dsn: str | None = None
) -> AsyncIterator[list[Server]]:
    """`count` replicas over one database (a fresh one by default), each on its own port."""
    dsn = dsn or await fresh_database(postgres_server)
    async with contextlib.AsyncExitStack() as stack:
        servers = []
        for i in range(count):
            config = (
                f"agents: []\nstore: postgres\npostgresDsn: '{dsn}'\n"
                f"replicaId: r{i}\nleaseSeconds: {LEASE}\n"
            )
            servers.append(await stack.enter_async_context(running_server(tmp_path, config)))
        yield servers


def sleeper(seconds: float = 0.5) -> agent_pb2.AgentOptions:
    """Turns that call `sleep` (so there is time to do things mid-turn), then answer."""
    call = scripted_pb2.ScriptedToolCall(name="sleep", arguments=f'{{"seconds": {seconds}}}')
    script = []
    for i in range(20):
        script.append(scripted_pb2.ScriptedStep(tool_calls=[call]))
        script.append(scripted_pb2.ScriptedStep(text=f"slept {i}"))
    return agent_pb2.AgentOptions(
        provider="scripted", model="m", tools=["sleep"], provider_options=script_options(script)
    )


async def wait_idle(server: Server, agent_id: str, seconds: int = 20) -> None:
    """Until the agent is idle; an `AGENT_MOVING` refusal (a woken owner) is retried."""
    request = api.WaitIdleRequest(agent_id=agent_id, timeout=duration_pb2.Duration(seconds=seconds))

    async def wait(remaining: float | None) -> api.WaitIdleResponse:
        return await server.agents.WaitIdle(request, timeout=remaining)

    response = await retried(wait, seconds + 5)
    assert response.idle


async def owned_again(server: Server, agent_id: str, seconds: float = 10) -> None:
    """Until `server` answers for the agent (taken over by some surviving replica)."""
    for _ in range(int(seconds / 0.1)):
        with contextlib.suppress(grpc.aio.AioRpcError):
            await server.factory.GetAgent(fac.GetAgentRequest(agent_id=agent_id), timeout=T)
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{agent_id} was not taken over")


def request_ids(events: list[ev.SessionEvent]) -> list[str]:
    return [e.user_message.request_id for e in events if e.HasField("user_message")]


async def test_any_replica_answers_and_a_stream_on_a_third_sees_everything_once(
    tmp_path: Path, postgres_server: str
) -> None:
    async with replicas(tmp_path, postgres_server) as (r0, r1, r2):
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(
                agent_id="a", options=agent_pb2.AgentOptions(tools=["word_count"])
            ),
            timeout=T,
        )
        session_id = created.agent.session_id
        with (
            EventStream(r2.agents, session_id=session_id) as by_session,
            EventStream(r1.agents, agent_id="a") as by_agent,
        ):
            for i, server in enumerate((r1, r2, r0, r1)):
                await server.agents.SendMessage(
                    api.SendMessageRequest(
                        agent_id="a", text=f"count {i} words", request_id=f"m{i}"
                    ),
                    timeout=T,
                )
                await wait_idle(server, "a")
            stored = await read_log(r2, session_id)
            while len(by_session.events) < len(stored):
                assert await by_session.next() is not None
            while len(by_agent.events) < len(stored):
                assert await by_agent.next() is not None
        check_log(stored)
        assert request_ids(stored) == ["m0", "m1", "m2", "m3"]
        for stream in (by_session, by_agent):
            assert [e.seq for e in stream.events] == list(
                range(FIRST_SEQ, FIRST_SEQ + len(stored))
            )  # once, in order
            assert [e.SerializeToString(deterministic=True) for e in stream.events] == [
                e.SerializeToString(deterministic=True) for e in stored
            ]
        got = await r2.factory.GetAgent(fac.GetAgentRequest(agent_id="a"), timeout=T)
        assert got.agent.session_id == session_id  # answered by the owner, r0


async def test_the_owner_dies_and_another_replica_finishes_its_work_once(
    tmp_path: Path, postgres_server: str
) -> None:
    async with replicas(tmp_path, postgres_server) as (r0, r1, r2):
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="s", options=sleeper(2)), timeout=T
        )
        session_id = created.agent.session_id
        with EventStream(r1.agents, session_id=session_id) as stream:
            await r2.agents.SendMessage(
                api.SendMessageRequest(agent_id="s", text="first", request_id="first"), timeout=T
            )
            await stream.until("tool_call")  # turn 1 sleeps on r0
            await r1.agents.SendMessage(
                api.SendMessageRequest(agent_id="s", text="second", request_id="second"),
                timeout=T,
            )
            await r0.crash()
            await owned_again(r1, "s")
            await wait_idle(r1, "s")
            stored = await read_log(r2, session_id)
            while len(stream.events) < len(stored):
                assert await stream.next() is not None
        check_log(stored)
        assert [e.seq for e in stream.events] == list(range(FIRST_SEQ, FIRST_SEQ + len(stored)))
        ends = [e.turn_end.reason.WhichOneof("kind") for e in stored if e.HasField("turn_end")]
        assert ends[0] == "interrupted"  # the crash's turn, closed by the new owner
        assert ends[-1] == "completed"
        assert request_ids(stored) == ["first", "second"]  # the queued one ran, once
        results = [e.tool_result for e in stored if e.HasField("tool_result")]
        assert results[0].error.name == "InterruptedError"


async def test_a_paused_owner_is_fenced_off_when_it_wakes(
    tmp_path: Path, postgres_server: str
) -> None:
    async with replicas(tmp_path, postgres_server, count=2) as (r0, r1):
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="p", options=sleeper(1.5)), timeout=T
        )
        session_id = created.agent.session_id
        await r1.agents.SendMessage(api.SendMessageRequest(agent_id="p", text="go"), timeout=T)
        with EventStream(r1.agents, session_id=session_id) as stream:
            await stream.until("tool_call")
        pid = r0.process.process.pid
        os.kill(pid, signal.SIGSTOP)  # paused mid-tool, past its lease
        try:
            await owned_again(r1, "p")
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_idle(r1, "p")
        await asyncio.sleep(2 * LEASE)  # the woken owner tries to write, and is refused
        await r1.agents.SendMessage(api.SendMessageRequest(agent_id="p", text="again"), timeout=T)
        await wait_idle(r1, "p")
        stored = await read_log(r1, session_id)
        check_log(stored)
        turns = [e.turn_start.turn for e in stored if e.HasField("turn_start")]
        assert turns == sorted(set(turns))  # no turn twice: the old owner wrote nothing more
        assert "taken over by another writer" in r0.log() or "was lost" in r0.log(), r0.log()
        with pytest.raises(grpc.aio.AioRpcError) as gone:  # r0 no longer runs it
            await r0.agents.SendMessage(
                api.SendMessageRequest(agent_id="p", text="x"),
                timeout=T,
                metadata=[("agentloop-forwarded", "1")],
            )
        # The agent lives on r1: r0 says "moving" (retry), never "not found" or "disposed".
        assert gone.value.code() == grpc.StatusCode.UNAVAILABLE, gone.value
        assert retry_delay(gone.value) is not None
        assert kinds(stored).count("turn_end") == kinds(stored).count("turn_start")


async def test_racing_creations_and_resumes_have_one_winner(
    tmp_path: Path, postgres_server: str
) -> None:
    async with replicas(tmp_path, postgres_server) as servers:
        answers = await asyncio.gather(
            *(
                s.factory.CreateAgent(fac.CreateAgentRequest(agent_id="dup"), timeout=T)
                for s in servers
            ),
            return_exceptions=True,
        )
        winners = [a for a in answers if isinstance(a, fac.CreateAgentResponse)]
        losers = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
        assert len(winners) == 1 and len(losers) == 2
        assert {e.code() for e in losers} == {grpc.StatusCode.ALREADY_EXISTS}
        session_id = winners[0].agent.session_id
        await servers[0].factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="dup"), timeout=T)
        resumes = await asyncio.gather(
            *(
                s.factory.ResumeAgent(
                    fac.ResumeAgentRequest(agent_id=f"back-{i}", session_id=session_id), timeout=T
                )
                for i, s in enumerate(servers)
            ),
            return_exceptions=True,
        )
        resumed = [a for a in resumes if isinstance(a, fac.ResumeAgentResponse)]
        assert len(resumed) == 1, resumes


async def test_a_plugin_registered_on_one_replica_serves_every_replica(
    tmp_path: Path, postgres_server: str, launcher: PluginLauncher
) -> None:
    guard = await launcher.start(guard_example("python"))
    async with replicas(tmp_path, postgres_server, count=2) as (r0, r1):
        registered = await r0.registry.RegisterPlugin(
            reg.RegisterPluginRequest(address=guard.address), timeout=T
        )
        name = registered.plugin.name
        await until_listed(r1, name, present=True)
        # An agent owned by r1 runs under the plugin r0 registered: it blocks the prompt.
        created = await r1.factory.CreateAgent(fac.CreateAgentRequest(agent_id="g"), timeout=T)
        await r1.agents.SendMessage(
            api.SendMessageRequest(agent_id="g", text="please rm -rf /"), timeout=T
        )
        await wait_idle(r1, "g")
        stored = await read_log(r0, created.agent.session_id)
        assert "prompt_blocked" in kinds(stored)
        await r1.registry.UnregisterPlugin(reg.UnregisterPluginRequest(name=name), timeout=T)
        await until_listed(r0, name, present=False)


async def until_listed(server: Server, name: str, *, present: bool) -> None:
    """Until `name` is (or is no longer) among the server's plugins."""
    for _ in range(100):
        listed = await server.registry.ListPlugins(reg.ListPluginsRequest(), timeout=T)
        if (name in {p.name for p in listed.plugins}) == present:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"plugin {name} {'never came' if present else 'never left'}")


async def test_any_replica_lists_every_agent_a_page_at_a_time(
    tmp_path: Path, postgres_server: str
) -> None:
    async with replicas(tmp_path, postgres_server) as (r0, r1, r2):
        for server, agent_id in ((r0, "b"), (r1, "a"), (r0, "c")):
            await server.factory.CreateAgent(fac.CreateAgentRequest(agent_id=agent_id), timeout=T)
        listed = await r2.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
        assert [a.agent_id for a in listed.agents] == ["a", "b", "c"]  # r2 runs none itself
        seen: list[str] = []
        token = ""
        while True:
            page = await r1.factory.ListAgents(
                fac.ListAgentsRequest(page_size=1, page_token=token), timeout=T
            )
            seen.extend(a.agent_id for a in page.agents)
            token = page.next_page_token
            if not token:
                break
        assert seen == ["a", "b", "c"]


async def test_a_child_is_not_taken_over_when_its_owners_replica_dies(
    tmp_path: Path, postgres_server: str
) -> None:
    slow = agent_pb2.AgentOptions(
        provider="scripted",
        model="m",
        provider_options=script_options(
            [
                scripted_pb2.ScriptedStep(
                    text="s" * 2000,
                    chunk_size=1,
                    chunk_delay=duration_pb2.Duration(nanos=20_000_000),
                )
            ]
        ),
    )
    boss = agent_pb2.AgentOptions(
        provider="scripted",
        model="m",
        tools=["delegate"],
        provider_options=script_options(
            [
                scripted_pb2.ScriptedStep(
                    tool_calls=[
                        scripted_pb2.ScriptedToolCall(
                            id="d1", name="delegate", arguments='{"task": "t", "profile": "slow"}'
                        )
                    ]
                ),
                scripted_pb2.ScriptedStep(text="never"),
            ]
        ),
    )
    boss.subagent_profiles["slow"].CopyFrom(slow)
    async with replicas(tmp_path, postgres_server, count=2) as (r0, r1):
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="boss", options=boss), timeout=T
        )
        await r0.agents.SendMessage(api.SendMessageRequest(agent_id="boss", text="go"), timeout=T)
        await owned_again(r0, "boss.d1")  # the child runs on its owner's replica
        child = await r0.factory.GetAgent(fac.GetAgentRequest(agent_id="boss.d1"), timeout=T)
        assert child.agent.lineage.parent_agent_id == "boss"
        await r0.crash()
        await owned_again(r1, "boss")  # the parent is taken over ...
        await wait_idle(r1, "boss")
        await asyncio.sleep(3 * LEASE)  # ... and the child, past its lease, is not
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await r1.factory.GetAgent(fac.GetAgentRequest(agent_id="boss.d1"), timeout=T)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        listed = await r1.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
        assert [a.agent_id for a in listed.agents] == ["boss"]
        child_log = await read_log(r1, child.agent.session_id)
        ends = [e.turn_end.reason.WhichOneof("kind") for e in child_log if e.HasField("turn_end")]
        assert ends == ["interrupted"]
        check_log(child_log)
        parent_log = await read_log(r1, created.agent.session_id)
        parent_ends = [
            e.turn_end.reason.WhichOneof("kind") for e in parent_log if e.HasField("turn_end")
        ]
        assert parent_ends == ["interrupted"]
