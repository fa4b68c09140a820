"""A woken owner acts for no agent it lost: it learns from its leases first.

Two real replicas over the real embedded PostgreSQL, each with its own real HTTP server
standing in for the model provider (so each model request says which replica made
it). r0 runs a turn whose tool sleeps; r0 is paused (SIGSTOP) mid-tool for three
leases, so r1 takes the agent over. Sends to r0 are on the wire while it is paused,
and go on after it wakes. Woken, r0's tool has finished and its turn would run its
next step, and the sends reach it at once; yet before its renewal has told it that
the agent is r1's now it serves none of them itself (each is forwarded to r1, or
refused `AGENT_MOVING`; never `ABORTED` by the fence) and runs no step (its model
provider hears nothing after the wake), and it tries to write nothing (no commit of
its is refused by the fence).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import grpc

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.conftest import EventStream
from tests.e2e.test_durability import Server, T, running_server
from tests.e2e.test_replica_outage import refusal
from tests.e2e.test_replicas import LEASE, read_log, request_ids, wait_idle
from tests.fake_openai import FakeOpenAI, Reply, call, chunk, text
from tests.invariants import check_log
from tests.postgres import fresh_database

SENDERS = 6
"""Clients sending to the paused owner, each its own call on the wire at the wake."""


def config(dsn: str, name: str, provider: FakeOpenAI) -> str:
    return (
        f"agents: []\nstore: postgres\npostgresDsn: '{dsn}'\nreplicaId: {name}\n"
        f"leaseSeconds: {LEASE}\nproviders:\n  - name: fake\n"
        f"    baseUrl: {provider.base_url}\n    defaultModel: gpt-test\n    maxAttempts: 1\n"
    )


async def keep_sending(
    server: Server, name: str, until: float, answers: list[tuple[str, str]], accepted: list[str]
) -> None:
    """Sends to agent "w" through `server` until `until`, each with an id of its own."""
    n = 0
    while time.monotonic() < until:
        request_id = f"{name}-{n}"
        n += 1
        send = api.SendMessageRequest(agent_id="w", text="hello", request_id=request_id)
        try:
            await server.agents.SendMessage(send, timeout=10)
        except grpc.aio.AioRpcError as error:
            answers.append((error.code().name, refusal(error)[0]))
            await asyncio.sleep(0.05)
            continue
        answers.append(("OK", ""))
        accepted.append(request_id)
        await asyncio.sleep(0.1)  # a few turns' worth, not a flood


async def test_a_woken_owner_serves_no_call_and_runs_no_step_for_an_agent_it_lost(
    tmp_path: Path, postgres_server: str
) -> None:
    dsn = await fresh_database(postgres_server)
    async with FakeOpenAI() as model0, FakeOpenAI() as model1, contextlib.AsyncExitStack() as stack:
        sleep = call(0, '{"seconds": 2}', call_id="c1", name="sleep")
        model0.script(Reply(events=[sleep, chunk(finish="tool_calls")]))
        model0.script(*(Reply(events=text("done")) for _ in range(50)))
        model1.script(*(Reply(events=text("done")) for _ in range(500)))
        r0 = await stack.enter_async_context(running_server(tmp_path, config(dsn, "r0", model0)))
        r1 = await stack.enter_async_context(running_server(tmp_path, config(dsn, "r1", model1)))
        options = agent_pb2.AgentOptions(provider="fake", tools=["sleep"])
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="w", options=options), timeout=T
        )
        session_id = created.agent.session_id
        with EventStream(r0.agents, session_id=session_id) as stream:
            await r0.agents.SendMessage(
                api.SendMessageRequest(agent_id="w", text="sleep", request_id="first"), timeout=T
            )
            await stream.until("tool_call")  # the tool sleeps 2 s on r0
        pid = r0.process.process.pid
        os.kill(pid, signal.SIGSTOP)
        answers: list[tuple[str, str]] = []
        accepted: list[str] = []
        try:
            await asyncio.sleep(2 * LEASE)  # r1 takes "w" over meanwhile
            until = time.monotonic() + 3 * LEASE
            senders = [
                asyncio.create_task(keep_sending(r0, f"s{i}", until, answers, accepted))
                for i in range(SENDERS)
            ]  # their first calls wait on r0's socket until it wakes
            await asyncio.sleep(LEASE)
        finally:
            os.kill(pid, signal.SIGCONT)
        woke = time.monotonic()
        await asyncio.gather(*senders)

        assert set(answers) <= {("OK", ""), ("UNAVAILABLE", "AGENT_MOVING")}, answers
        assert ("OK", "") in answers  # forwarded to the new owner, which accepted them
        late = [seen.time - woke for seen in model0.requests if seen.time >= woke]
        assert not late, late  # r0 ran no step for "w" after waking
        assert len(model0.requests) == 1
        r0_log = r0.log()
        assert "the lease of agent w was lost" in r0_log, r0_log
        assert "commit refused" not in r0_log, r0_log  # it tried to write nothing either

        await wait_idle(r1, "w")
        stored = await read_log(r1, session_id)
        check_log(stored)
        ids = request_ids(stored)
        assert len(ids) == len(set(ids)) and set(accepted) <= set(ids), (ids, accepted)
        ends = [e.turn_end.reason.WhichOneof("kind") for e in stored if e.HasField("turn_end")]
        assert ends[0] == "interrupted", ends  # r0's turn, closed by r1 when it took over
        print(f"{len(answers)} sends to the woken r0: {sorted(set(answers))}")
