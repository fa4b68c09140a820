"""What clients see while an agent moves: OK, `UNAVAILABLE` `AGENT_MOVING`, or `ABORTED`.

Two real replicas over the real embedded PostgreSQL, a client sending (with request
ids) and reading through the survivor all along, and readers calling both replicas back
to back (at least 2,000 answers in all, each checked). The owner is paused (SIGSTOP) for
three leases with those sends landing on it: the survivor takes the agent over within
the documented bound (a lease and a half, plus slack for a loaded machine), every
call meanwhile is answered OK, `UNAVAILABLE` with `AGENT_MOVING` (or
`STORE_UNAVAILABLE`) and a retry delay, or `ABORTED` (a fenced write), never
`NOT_FOUND`, `AGENT_DISPOSED`, `UNKNOWN` or a timeout; the woken owner stops (it lost
the lease), answers for the agent only by routing to the new owner, and nothing it
did after waking is in the log: every accepted message is there once, no turn twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from agentloop.retrying import retry_delay
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.test_durability import Server, T, word_count_options
from tests.e2e.test_replica_outage import refusal
from tests.e2e.test_replicas import LEASE, read_log, replicas, request_ids, wait_idle
from tests.invariants import check_log

CALL_TIMEOUT = 5.0
BOUND = 1.5 * LEASE
"""The documented failover bound: the lease, then at most half a lease to the next sweep."""
SLACK = 2.0
"""Seconds of slack for a shared, loaded test machine."""


@dataclass
class Seen:
    """Every answer: (when the call began, method, code, reason)."""

    calls: list[tuple[float, str, str, str]] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)

    async def call(self, method: str, call: object) -> bool:
        began = time.monotonic()
        try:
            await call  # type: ignore[misc]
        except grpc.aio.AioRpcError as error:
            reason, _ = refusal(error)
            self.calls.append((began, method, error.code().name, reason))
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                assert retry_delay(error) is not None, error  # a retry delay, always
            return False
        self.calls.append((began, method, "OK", ""))
        return True


async def load(server: Server, name: str, seen: Seen) -> None:
    """Reads and sends (retried with the same id until accepted) until cancelled."""
    n = 0
    while True:
        await seen.call("GetAgent", server.factory.GetAgent(
            fac.GetAgentRequest(agent_id="m"), timeout=CALL_TIMEOUT))  # fmt: skip
        request_id = f"{name}-{n}"
        send = api.SendMessageRequest(agent_id="m", text="count these words", request_id=request_id)
        for _ in range(200):
            if await seen.call("SendMessage", server.agents.SendMessage(
                    send, timeout=CALL_TIMEOUT)):  # fmt: skip
                seen.accepted.append(request_id)
                break
            await asyncio.sleep(0.1)
        n += 1
        await asyncio.sleep(0.05)


async def read(server: Server, seen: Seen) -> None:
    """Agent-scoped reads and listings, back to back, until cancelled."""
    while True:
        await seen.call("GetAgent", server.factory.GetAgent(
            fac.GetAgentRequest(agent_id="m"), timeout=CALL_TIMEOUT))  # fmt: skip
        await seen.call("GetSession", server.agents.GetSession(
            api.GetSessionRequest(agent_id="m"), timeout=CALL_TIMEOUT))  # fmt: skip
        await seen.call("ListAgents", server.factory.ListAgents(
            fac.ListAgentsRequest(), timeout=CALL_TIMEOUT))  # fmt: skip


CALLS = 2000
"""Calls answered over the move, at the least: the statuses are checked on thousands."""


async def test_a_paused_owner_moves_its_agent_and_clients_see_only_truthful_statuses(
    tmp_path: Path, postgres_server: str
) -> None:
    async with replicas(tmp_path, postgres_server, count=2) as (r0, r1):
        created = await r0.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="m", options=word_count_options()), timeout=T
        )
        session_id = created.agent.session_id
        seen = Seen()
        through_r1 = asyncio.create_task(load(r1, "r1", seen))
        readers = [asyncio.create_task(read(server, seen)) for server in (r0, r1, r1)]
        await asyncio.sleep(1.0)  # sends forwarded to r0, which commits them
        pid = r0.process.process.pid
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            await asyncio.sleep(3 * LEASE)
        finally:
            os.kill(pid, signal.SIGCONT)
        through_r0 = asyncio.create_task(load(r0, "r0", seen))  # the woken owner
        await asyncio.sleep(2 * LEASE)
        for _ in range(600):  # on a slow machine, read on until thousands were answered
            if len(seen.calls) >= CALLS:
                break
            await asyncio.sleep(0.1)
        tasks = [through_r1, through_r0, *readers]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert len(seen.calls) >= CALLS, len(seen.calls)

        takeover, codes = await check_the_move(seen, stopped, r0, r1, session_id)
        moving = sum(1 for began, *_ in seen.calls if stopped <= began <= stopped + takeover)
        print(
            f"takeover {takeover:.2f} s after the pause; {len(seen.calls)} answers,"
            f" {moving} begun while the owner was stopped: {sorted(codes)}"
        )


async def check_the_move(
    seen: Seen, stopped: float, old: Server, new: Server, session_id: str
) -> tuple[float, set[tuple[str, str, str]]]:
    """What a move must hold: truthful answers, a takeover in the bound, a whole log once.

    The takeover time (from `stopped`) and the answers seen, as (method, code, reason).
    """
    codes = {(method, code, reason) for _, method, code, reason in seen.calls}
    assert {code for _, code, _ in codes} <= {"OK", "UNAVAILABLE", "ABORTED"}, codes
    assert {reason for _, code, reason in codes if code == "UNAVAILABLE"} <= {
        "AGENT_MOVING",
        "STORE_UNAVAILABLE",
    }, codes
    served = [
        began for began, method, code, _ in seen.calls
        if method == "GetAgent" and code == "OK" and began > stopped
    ]  # fmt: skip
    assert served, seen.calls
    takeover = served[0] - stopped
    assert takeover < BOUND + SLACK, takeover  # the new owner answers by itself: it took the agent

    await wait_idle(new, "m")
    stored = await read_log(new, session_id)
    check_log(stored)
    ids = request_ids(stored)
    assert len(ids) == len(set(ids)), ids  # nothing twice
    assert set(seen.accepted) <= set(ids)  # nothing accepted lost
    turns = [e.turn_start.turn for e in stored if e.HasField("turn_start")]
    assert turns == sorted(set(turns))  # no turn run twice
    assert "was lost" in old.log() or "another writer" in old.log(), old.log()
    return takeover, codes
