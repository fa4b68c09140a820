"""Reads are monotonic across a takeover, and a live agent is listed while it moves.

Two real replicas over the real embedded PostgreSQL. Four agents live on r0 (and four on
r1, so no rebalancing moves any before the pause); a stream
on r1 follows one agent's session, and a client sends to that agent through r1 all
along. r0 is paused (SIGSTOP) for three leases, so r1 takes the agents over:
- `ListAgents` on r1 while r0 cannot answer lists all four (those between owners
  marked `moving`), never fewer, and within a deadline shorter than the 5 s it once
  waited for the paused r0 (it waits a third of a lease for a peer's page);
- once r0 wakes (its live copy of the session now behind the store: r1 wrote on),
  `GetSession` and `ListSessionEvents` on either replica, by session id or agent id,
  hold at least every event the stream had delivered when the read began. An
  agent-scoped read may instead be refused `UNAVAILABLE` `AGENT_MOVING`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.test_durability import Server, T, word_count_options
from tests.e2e.test_replica_outage import refusal
from tests.e2e.test_replicas import LEASE, read_log, replicas, request_ids, wait_idle
from tests.invariants import check_log

LIST_DEADLINE = 2.5
"""Seconds `ListAgents` may take with r0 paused: it waits a third of a lease for r0, then
lists r0's agents from their leases; waiting for r0 as long as a forwarded call (5 s)
would end this call `DEADLINE_EXCEEDED`."""

AGENTS = ("m", "n0", "n1", "n2")
BESIDE = ("p0", "p1", "p2", "p3")
"""r1's own agents: with four each, both replicas hold their fair share, so no
rebalancing hands r0's agents over before the pause: r1 must take them over."""


@dataclass
class Delivered:
    """The highest seq the stream delivered, and every read's (replica, what, got, mark)."""

    seq: int = 0
    reads: list[tuple[str, str, int, int]] = field(default_factory=list)
    refused: set[tuple[str, str]] = field(default_factory=set)


async def follow(server: Server, session_id: str, seen: Delivered) -> None:
    """Follow the session by id on `server`, resuming after a break, until cancelled."""
    while True:
        call = server.agents.StreamSessionEvents(
            api.StreamSessionEventsRequest(session_id=session_id, from_seq=seen.seq + 1)
        )
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for response in call:
                for event in response.events:
                    assert event.seq == seen.seq + 1, (event.seq, seen.seq)  # in order, once
                    seen.seq = event.seq
        await asyncio.sleep(0.1)


async def send(server: Server, accepted: list[str]) -> None:
    """Messages to "m" through `server`, each retried with its id until accepted."""
    n = 0
    while True:
        request = api.SendMessageRequest(agent_id="m", text="count these words", request_id=f"s{n}")
        with contextlib.suppress(grpc.aio.AioRpcError):
            await server.agents.SendMessage(request, timeout=5)
            accepted.append(request.request_id)
            n += 1
        await asyncio.sleep(0.2)


async def read(server: Server, name: str, session_id: str, seen: Delivered) -> None:
    """One read of each kind on `server`, each checked against what was delivered before it."""
    selectors = {
        "session": (
            api.GetSessionRequest(session_id=session_id),
            api.ListSessionEventsRequest(session_id=session_id),
        ),
        "agent": (api.GetSessionRequest(agent_id="m"), api.ListSessionEventsRequest(agent_id="m")),
    }
    for selector, (get, listing) in selectors.items():
        mark = seen.seq
        try:
            got = await server.agents.GetSession(get, timeout=T)
            seen.reads.append((name, f"GetSession by {selector}", got.session.event_count, mark))
            mark = seen.seq
            listing.from_seq = max(mark, 1)  # the tail: it holds `mark`, unless the read is behind
            page = await server.agents.ListSessionEvents(listing, timeout=T)
            last = page.events[-1].seq if page.events else 0
            seen.reads.append((name, f"ListSessionEvents by {selector}", last, mark))
        except grpc.aio.AioRpcError as error:
            seen.refused.add((error.code().name, refusal(error)[0]))
            if selector == "session":
                raise  # a read from the store is never refused here


async def test_reads_after_a_takeover_hold_what_a_stream_delivered_and_moving_agents_are_listed(
    tmp_path: Path, postgres_server: str
) -> None:
    async with replicas(tmp_path, postgres_server, count=2) as (r0, r1):
        for agent_id in AGENTS:
            created = await r0.factory.CreateAgent(
                fac.CreateAgentRequest(agent_id=agent_id, options=word_count_options()), timeout=T
            )
            if agent_id == "m":
                session_id = created.agent.session_id
        for agent_id in BESIDE:
            await r1.factory.CreateAgent(
                fac.CreateAgentRequest(agent_id=agent_id, options=word_count_options()), timeout=T
            )
        seen = Delivered()
        accepted: list[str] = []
        background = [
            asyncio.create_task(follow(r1, session_id, seen)),
            asyncio.create_task(send(r1, accepted)),
        ]
        try:
            await asyncio.sleep(1.0)  # turns on r0, delivered through r1's stream
            pid = r0.process.process.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                listed = await r1.factory.ListAgents(
                    fac.ListAgentsRequest(page_size=10), timeout=LIST_DEADLINE
                )
                await asyncio.sleep(3 * LEASE)
            finally:
                os.kill(pid, signal.SIGCONT)
            woke = time.monotonic()
            while time.monotonic() - woke < 2 * LEASE:  # the woken r0, and r1, read on
                await asyncio.gather(
                    read(r0, "r0", session_id, seen), read(r1, "r1", session_id, seen)
                )
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

        listed_ids = sorted(a.agent_id for a in listed.agents)
        assert listed_ids == sorted(AGENTS + BESIDE), listed  # every live one
        assert any(a.moving for a in listed.agents), listed  # r0 could not answer for them
        for agent in listed.agents:
            assert agent.session_id and agent.options.model == "m", agent
        behind = [r for r in seen.reads if r[2] < r[3]]
        assert not behind, behind  # no read held less than the stream had delivered
        assert {name for name, *_ in seen.reads} == {"r0", "r1"}, seen.reads
        assert seen.refused <= {("UNAVAILABLE", "AGENT_MOVING")}, seen.refused

        await wait_idle(r1, "m")
        stored = await read_log(r1, session_id)
        check_log(stored)
        assert stored[-1].seq >= seen.seq
        ids = request_ids(stored)
        assert len(ids) == len(set(ids)) and set(accepted) <= set(ids)
        assert "taking over agent m" in r1.log(), r1.log()
        print(f"{len(seen.reads)} reads; stream at seq {seen.seq}; refusals {seen.refused}")
