"""A creation late past its lease: its agent is still routed to, never `NOT_FOUND`.

Two real replicas over the real embedded PostgreSQL. r0 creates an agent and is late
twice, as on a loaded machine: its lease renewals miss the new lease, and its session
is not stored yet when the lease expires (two triggers in the database hold them).
r1's sweep takes the expired lease, finds no session to resume, and gives the lease
up (as for an agent whose creator died before storing it). Then r0's creation goes
on: the `CreateAgent` answers OK, so a call for the agent on r1 must reach it (OK,
or a retryable `AGENT_MOVING` meanwhile), never `NOT_FOUND` (found in a full run of
the suite on a loaded machine: r0 ran the agent with no lease, and r1 answered for it
as for an unknown id).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg

from agentloop.retrying import retried
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.test_durability import T, word_count_options
from tests.e2e.test_replicas import read_log, replicas, request_ids, wait_idle
from tests.invariants import check_log
from tests.postgres import fresh_database

LATE = """
CREATE TABLE late (done boolean NOT NULL);
INSERT INTO late VALUES (false);
CREATE FUNCTION late_renewal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.owner = 'r0' AND NEW.owner = 'r0' AND NOT (SELECT done FROM late) THEN
    RETURN NULL;  -- r0's renewal misses the lease: it expires
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER late_renewal BEFORE UPDATE ON leases FOR EACH ROW
  WHEN (OLD.agent_id = 'late') EXECUTE FUNCTION late_renewal();
CREATE FUNCTION late_session() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  WHILE NOT (SELECT done FROM late)
      AND clock_timestamp() - statement_timestamp() < interval '4 seconds' LOOP
    PERFORM pg_sleep(0.01);  -- r0's session is stored only once r1 swept
  END LOOP;
  RETURN NEW;
END $$;
CREATE TRIGGER late_session BEFORE INSERT ON sessions FOR EACH ROW
  WHEN (NEW.session_id LIKE 'late-session-%') EXECUTE FUNCTION late_session();
"""
"""r0 late for the agent `late`, until `late.done`: no renewal, its session held back
(at most 4 s: within the statement timeout, which would fail the creation)."""


async def until(db: asyncpg.Connection, query: str, seconds: float = 20) -> None:
    """Until `query` returns true."""
    for _ in range(int(seconds / 0.05)):
        if await db.fetchval(query):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {query}")


async def test_an_agent_whose_creation_was_late_past_its_lease_is_routed_to(
    tmp_path: Path, postgres_server: str
) -> None:
    dsn = await fresh_database(postgres_server)
    async with replicas(tmp_path, postgres_server, count=2, dsn=dsn) as (r0, r1):
        db = await asyncpg.connect(dsn)
        try:
            await db.execute(LATE)
            creating = asyncio.ensure_future(
                r0.factory.CreateAgent(
                    fac.CreateAgentRequest(agent_id="late", options=word_count_options()),
                    timeout=T,
                )
            )
            await until(db, "SELECT EXISTS (SELECT 1 FROM leases WHERE agent_id = 'late')")
            # r1 takes the expired lease over, finds no session, and gives the lease up.
            await until(db, "SELECT NOT EXISTS (SELECT 1 FROM leases WHERE agent_id = 'late')")
            assert "taking over agent late" in r1.log(), r1.log()
            assert not await db.fetchval("SELECT count(*) FROM sessions")  # still held back
            await db.execute("UPDATE late SET done = true")
            created = await creating

            async def send(remaining: float | None) -> api.SendMessageResponse:
                request = api.SendMessageRequest(agent_id="late", text="count", request_id="r1")
                return await r1.agents.SendMessage(request, timeout=remaining)

            await retried(send, T)  # forwarded to r0 (`AGENT_MOVING` meanwhile), not NOT_FOUND
            owner = await db.fetchval("SELECT owner FROM leases WHERE agent_id = 'late'")
            assert owner == "r0", owner  # held again once its session was stored
        finally:
            await db.close()
        await wait_idle(r1, "late")
        stored = await read_log(r1, created.agent.session_id)
        check_log(stored)
        assert request_ids(stored) == ["r1"]
