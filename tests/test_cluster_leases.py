"""Leases in one replica, in-process over a real PostgreSQL: a replica keeps what it holds.

A replica loses an agent only when another replica took its lease. Not when it was
late to renew and nobody took it, not to its own sweep, and not while its sweep
resumes one by one the many agents of a replica that died (the leases taken first
must not lapse while the later agents are resumed): an agent stopped there would leave
the messages it had accepted pending with nobody to run them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from agentloop.v1 import agent_pb2
from server.cluster.leases import Cluster
from server.cluster.routing import AgentMoving
from server.kernel.errors import AlreadyExists
from server.stores.postgres import PostgresStore
from server.stores.postgres_leases import Lease, Leases
from tests.postgres import drop_database, fresh_database

TTL = 1.0
"""The lease time, in seconds."""

AGENTS = ["a0", "a1", "a2", "a3"]


@pytest.fixture
async def store(postgres_server: str) -> AsyncIterator[PostgresStore]:
    dsn = await fresh_database(postgres_server)
    s = PostgresStore(dsn)
    await s.open()
    try:
        yield s
    finally:
        await s.close()
        await drop_database(postgres_server, dsn)


async def leases_of(store: PostgresStore) -> dict[str, tuple[str, bool]]:
    """Per agent: its owner, and whether its lease ends one lease time after the last renewal.

    A renewal extends the leases and beats the heartbeat in one transaction, so an
    extended lease ends exactly `TTL` after the owner's heartbeat.
    """
    pool = await store.pool()
    rows = await pool.fetch(
        "SELECT agent_id, owner,"
        " expires_at = heartbeat + make_interval(secs => $1) AS renewed"
        " FROM leases JOIN replicas ON replicas.replica_id = leases.owner",
        TTL,
    )
    return {r["agent_id"]: (r["owner"], r["renewed"]) for r in rows}


async def heartbeat(store: PostgresStore, replica_id: str) -> float:
    pool = await store.pool()
    value = await pool.fetchval(
        "SELECT extract(epoch FROM heartbeat) FROM replicas WHERE replica_id = $1", replica_id
    )
    return float(value)


async def database_now(store: PostgresStore) -> float:
    pool = await store.pool()
    return float(await pool.fetchval("SELECT extract(epoch FROM clock_timestamp())"))


async def a_renewal_ran_after(store: PostgresStore, moment: float) -> None:
    """Wait (bounded) until a renewal that began after `moment` has run to its end.

    The heartbeat moves past `moment`, then once more: renewals run one after the
    other, so the first one (and whatever it stopped) is done by then.
    """
    first = None
    for _ in range(600):
        beat = await heartbeat(store, "me")
        if first is None and beat > moment:
            first = beat
        elif first is not None and beat > first:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no renewal")


async def lapse(store: PostgresStore) -> None:
    """Wait until a lease taken now has expired (the database's clock)."""
    late = await database_now(store) + TTL
    for _ in range(600):
        if await database_now(store) > late:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the clock did not move")


async def dead_replica_with_agents(store: PostgresStore) -> None:
    """A replica that held `AGENTS` and died: its leases are all expired."""
    dead = Leases(store, "dead", "127.0.0.1:1", TTL)
    await dead.register()
    for agent_id in AGENTS:
        assert await dead.acquire(agent_id, f"{agent_id}-session", b"") is None
    await dead.hand_over()


async def test_a_sweep_that_takes_many_agents_keeps_them_all_while_it_resumes_them(
    store: PostgresStore,
) -> None:
    await dead_replica_with_agents(store)
    held: set[str] = set()
    abandoned: list[str] = []
    resumed = asyncio.Event()

    async def resume(lease: Lease) -> None:
        if lease.agent_id == AGENTS[0]:
            # A slow resume (a long log, a loaded machine): longer than a lease, so the
            # leases taken with this one lapse unless they are renewed meanwhile.
            await asyncio.sleep(1.5 * TTL)
        held.add(lease.agent_id)
        if held == set(AGENTS):
            resumed.set()

    async def abandon(agent_id: str) -> None:
        abandoned.append(agent_id)
        held.discard(agent_id)

    me = Cluster(Leases(store, "me", "127.0.0.1:2", TTL))
    await me.register()
    me.start(lambda: set(held), resume, abandon)
    try:
        await asyncio.wait_for(resumed.wait(), 30)
        await a_renewal_ran_after(store, await database_now(store))
        leases = await leases_of(store)
    finally:
        await me.stop()
    assert abandoned == []
    assert leases == {agent_id: ("me", True) for agent_id in AGENTS}


async def test_a_replica_late_to_renew_keeps_the_agents_nobody_took(
    store: PostgresStore,
) -> None:
    await dead_replica_with_agents(store)
    taken = await Leases(store, "me", "127.0.0.1:2", TTL).take_over()
    assert sorted(lease.agent_id for lease in taken) == AGENTS
    await lapse(store)  # every lease lapsed: this replica stalled
    resumed: list[str] = []
    abandoned: list[str] = []

    async def resume(lease: Lease) -> None:
        resumed.append(lease.agent_id)

    async def abandon(agent_id: str) -> None:
        abandoned.append(agent_id)

    me = Cluster(Leases(store, "me", "127.0.0.1:2", TTL))
    await me.register()
    after = await database_now(store)
    me.start(lambda: set(AGENTS), resume, abandon)  # it runs them all
    try:
        await a_renewal_ran_after(store, after)
        leases = await leases_of(store)
    finally:
        await me.stop()
    assert abandoned == []  # nobody took them: they are still this replica's
    assert resumed == []  # and its own sweep does not take the agents it runs
    assert leases == {agent_id: ("me", True) for agent_id in AGENTS}


async def test_a_replica_stops_the_agents_another_took_and_only_those(
    store: PostgresStore,
) -> None:
    mine = Leases(store, "me", "127.0.0.1:2", TTL)
    other = Leases(store, "other", "127.0.0.1:3", TTL)
    for replica in (mine, other):
        await replica.register()
    for agent_id in AGENTS[:2]:
        assert await mine.acquire(agent_id, f"{agent_id}-session", b"") is None
    await mine.hand_over()  # this replica stalled: its leases lapsed...
    pool = await store.pool()
    await pool.execute(  # ...and the other replica took a0 over (a1 nobody took)
        "UPDATE leases SET owner = 'other', expires_at = now() + interval '1 hour'"
        " WHERE agent_id = $1",
        AGENTS[0],
    )
    abandoned: list[str] = []

    async def resume(lease: Lease) -> None:
        raise AssertionError(f"nothing to take over, yet {lease.agent_id} was")

    held = set(AGENTS[:3])  # a0 and a1 run here; a2 is being created, not leased yet

    async def abandon(agent_id: str) -> None:
        abandoned.append(agent_id)
        held.discard(agent_id)

    me = Cluster(mine)
    after = await database_now(store)
    me.start(lambda: set(held), resume, abandon)
    try:
        await a_renewal_ran_after(store, after)
    finally:
        await me.stop()
    assert abandoned == [AGENTS[0]]
    leases = await leases_of(store)
    assert leases[AGENTS[1]] == ("me", True)
    assert AGENTS[2] not in leases


async def test_a_resume_racing_this_replicas_own_takeover_is_told_the_agent_is_live(
    store: PostgresStore,
) -> None:
    await dead_replica_with_agents(store)
    resuming = asyncio.Event()
    release = asyncio.Event()

    async def resume(lease: Lease) -> None:
        if lease.agent_id == AGENTS[0]:
            resuming.set()
            await release.wait()

    async def abandon(agent_id: str) -> None:
        raise AssertionError(f"{agent_id} was abandoned")

    me = Cluster(Leases(store, "me", "127.0.0.1:2", TTL))
    await me.register()
    me.start(set, resume, abandon)
    try:
        await asyncio.wait_for(resuming.wait(), 30)
        # A client's ResumeAgent lands while the sweep resumes the agent here: the lease
        # is this replica's, so the agent is live, not "driven by another agent".
        with pytest.raises(AlreadyExists, match="taking it over"):
            await me.acquire(AGENTS[0], f"{AGENTS[0]}-session", agent_pb2.AgentOptions())
    finally:
        release.set()
        await me.stop()


async def test_the_sweep_comes_at_the_first_expiry_of_another_replicas_lease(
    store: PostgresStore,
) -> None:
    other = Leases(store, "other", "127.0.0.1:3", TTL)
    await other.register()
    assert await other.acquire(AGENTS[0], f"{AGENTS[0]}-session", b"") is None
    me = Cluster(Leases(store, "me", "127.0.0.1:2", TTL))
    await me.register()
    assert me.settled()  # a replica starts in touch: it may take expired leases at once

    until = await me.leases.next_expiry()
    assert until is not None and 0 < until <= TTL
    assert await me.leases.next_expiry({AGENTS[0]}) is None  # those it runs do not count
    assert await other.next_expiry() is None  # nor a replica's own
    assert await me.next_sweep() == TTL / 2  # a lease away: the usual half lease at most

    pool = await store.pool()
    await pool.execute(  # the owner's last renewal was most of a lease ago
        "UPDATE leases SET expires_at = now() + make_interval(secs => $1)", TTL / 5
    )
    wait = await me.next_sweep()
    assert TTL / 10 < wait <= TTL / 5 + 0.01, wait  # at the expiry, not a fixed period later
    await other.hand_over()  # expired now: the next sweep comes at once (its shortest wait)
    assert await me.next_sweep() == pytest.approx(TTL / 20)


async def test_a_woken_replica_stops_the_agents_it_lost_before_it_acts_again(
    store: PostgresStore,
) -> None:
    mine = Leases(store, "me", "127.0.0.1:2", TTL)
    await mine.register()
    for agent_id in AGENTS[:2]:
        assert await mine.acquire(agent_id, f"{agent_id}-session", b"") is None
    held = set(AGENTS[:2])
    seen: list[tuple[str, bool]] = []
    me = Cluster(mine)

    async def resume(lease: Lease) -> None:
        raise AssertionError(f"nothing to take over, yet {lease.agent_id} was")

    def lose(agent_id: str) -> None:
        seen.append((f"lost {agent_id}", me.acting()))

    async def abandon(agent_id: str) -> None:  # its teardown, once acting again
        seen.append((f"torn down {agent_id}", me.acting()))
        held.discard(agent_id)

    async def step() -> None:  # an agent's next step, begun as the process wakes
        await me.until_acting()
        seen.append(("stepped", me.acting()))

    me.start(lambda: set(held), resume, abandon, lose=lose)
    try:
        await a_renewal_ran_after(store, await database_now(store))
        pool = await store.pool()
        await pool.execute(  # another replica takes a0 over while this one is stalled...
            "UPDATE leases SET owner = 'other', expires_at = now() + interval '1 hour'"
            " WHERE agent_id = $1",
            AGENTS[0],
        )
        time.sleep(TTL)  # noqa: ASYNC251 - a stall of the whole process, past its renew deadline
        assert not me.acting()
        stepping = asyncio.create_task(step())
        await a_renewal_ran_after(store, await database_now(store))
        await asyncio.wait_for(stepping, 10)
    finally:
        await me.stop()
        await me.stop_renewal()
    # The lost agent was stopped while this replica did not act yet; the step waited;
    # the teardown came once acting again (it may wait for the other agents' commits).
    assert seen[0] == (f"lost {AGENTS[0]}", False), seen
    assert sorted(seen[1:]) == [("stepped", True), (f"torn down {AGENTS[0]}", True)], seen
    assert held == {AGENTS[1]}


async def test_a_sweep_resumes_the_agents_clients_asked_for_first(store: PostgresStore) -> None:
    many = [f"d{i}" for i in range(10)]
    dead = Leases(store, "dead", "127.0.0.1:1", TTL)
    await dead.register()
    for agent_id in many:
        assert await dead.acquire(agent_id, f"{agent_id}-session", b"") is None
    await dead.hand_over()
    began: list[str] = []
    all_resumed = asyncio.Event()

    async def resume(lease: Lease) -> None:
        began.append(lease.agent_id)
        await asyncio.sleep(0.01)
        if len(began) == len(many):
            all_resumed.set()

    async def abandon(agent_id: str) -> None:
        raise AssertionError(agent_id)

    me = Cluster(Leases(store, "me", "127.0.0.1:2", TTL))
    await me.register()
    for agent_id in ("d7", "d3"):  # calls for them were refused AGENT_MOVING here
        me.wanted(agent_id)
    me.start(lambda: set(began), resume, abandon)
    try:
        await asyncio.wait_for(all_resumed.wait(), 30)
    finally:
        await me.stop()
    assert set(began[:2]) == {"d7", "d3"}, began  # not queued behind the idle ones
    assert sorted(began) == sorted(many)


async def test_an_agent_going_live_holds_its_lease_again_unless_another_replica_holds_it(
    store: PostgresStore,
) -> None:
    me = Cluster(Leases(store, "me", "127.0.0.1:2", TTL))
    other = Leases(store, "other", "127.0.0.1:3", TTL)
    await me.register()
    await other.register()
    options = agent_pb2.AgentOptions()
    await me.acquire("a", "a-session", options)
    await me.confirm("a", "a-session", options)  # its own: kept
    assert (await leases_of(store))["a"][0] == "me"
    # Its creation is late: the lease expires, another replica's sweep takes it and,
    # finding no session yet, gives it up.
    await me.leases.hand_over()
    assert [lease.agent_id for lease in await other.take_over()] == ["a"]
    await other.release("a")
    assert "a" not in await leases_of(store)
    await me.confirm("a", "a-session", options)  # its session is stored now: held again
    assert (await leases_of(store))["a"][0] == "me"
    # Another replica holds it live (took it over and resumes it): the caller may retry.
    await me.leases.hand_over()
    assert [lease.agent_id for lease in await other.take_over()] == ["a"]
    with pytest.raises(AgentMoving):
        await me.confirm("a", "a-session", options)
    assert (await leases_of(store))["a"][0] == "other"
