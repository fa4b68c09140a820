"""Leases: which replica owns each live agent, for how long (PostgreSQL).

A replica registers itself (id, the address other replicas forward to, a heartbeat).
Creating or resuming an agent takes its lease: a row keyed by agent id (and unique by
session id) with an owner and an expiry, held again (`confirm`) as the agent goes live,
its session stored. The owner renews its leases in the background; a lease that
expired (its owner died, or was paused past it) can be taken over by any replica,
which then claims the session (the store's fence refuses the old owner's late writes)
and runs the agent. The agent's options travel with the lease, so the new owner
recreates the same agent.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import asyncpg

from server.stores.postgres import PostgresStore
from server.stores.postgres_outage import outages_unavailable

LEASE_FREE = "leases.expires_at < now()"
"""A lease any replica may take for a new live agent: it expired."""

LEASE_MINE = "(leases.owner = excluded.owner AND leases.session_id = excluded.session_id)"
"""A lease this replica holds already, on the same session."""


@dataclass(frozen=True)
class Lease:
    """An agent, its session, its options (serialized `AgentOptions`) and its (last) owner."""

    agent_id: str
    session_id: str
    owner: str
    options: bytes


@dataclass(frozen=True)
class Location:
    """Where an agent's lease stands: its owner, the owner's address, and whether it is live.

    A lease that is not live has expired: its agent is between owners (a failover).
    """

    owner: str
    address: str
    live: bool


@dataclass(frozen=True)
class Holder:
    """Who holds what a replica asked for: the owner, and its address."""

    owner: str
    address: str


@outages_unavailable(lambda leases: leases.store.health)
class Leases:
    """The lease table, as seen by one replica."""

    def __init__(self, store: PostgresStore, replica_id: str, address: str, ttl: float) -> None:
        self.store = store
        self.replica_id = replica_id
        self.address = address
        self.ttl = ttl

    async def register(self) -> None:
        """Record this replica and the address other replicas forward its agents' calls to."""
        pool = await self.store.pool()
        await pool.execute(
            "INSERT INTO replicas (replica_id, address) VALUES ($1, $2)"
            " ON CONFLICT (replica_id) DO UPDATE SET address = $2, heartbeat = now()",
            self.replica_id,
            self.address,
        )

    async def acquire(self, agent_id: str, session_id: str, options: bytes) -> Holder | None:
        """Take the lease of a new live agent; None when taken, else who holds it.

        The agent id is free when no lease names it or its lease expired; the session
        must not be driven under another agent id.
        """
        return await self._insert(agent_id, session_id, options, LEASE_FREE)

    async def confirm(self, agent_id: str, session_id: str, options: bytes) -> Holder | None:
        """Hold the lease of an agent about to go live here; None when held, else who holds it.

        As `acquire`, and also when this replica holds it already. Taken again when it
        is gone: a creation that stalled past its lease before its session was stored
        may have had its lease taken by a sweep whose resume found no session, and
        released. The session is stored now: a later takeover resumes the agent.
        """
        return await self._insert(agent_id, session_id, options, f"{LEASE_FREE} OR {LEASE_MINE}")

    async def _insert(
        self, agent_id: str, session_id: str, options: bytes, free: str
    ) -> Holder | None:
        pool = await self.store.pool()
        try:
            owner = await pool.fetchval(
                "INSERT INTO leases (agent_id, session_id, owner, expires_at, options)"
                " VALUES ($1, $2, $3, now() + make_interval(secs => $4), $5)"
                " ON CONFLICT (agent_id) DO UPDATE SET session_id = excluded.session_id,"
                " owner = excluded.owner, expires_at = excluded.expires_at,"
                f" options = excluded.options WHERE {free} RETURNING owner",
                agent_id,
                session_id,
                self.replica_id,
                self.ttl,
                options,
            )
        except asyncpg.UniqueViolationError:  # the session is leased under another agent id
            return await self._holder("session_id", session_id) or Holder("", "")
        if owner is not None:
            return None
        return await self._holder("agent_id", agent_id) or Holder("", "")

    async def renew(self, running: set[str], draining: bool = False) -> set[str]:
        """Extend the leases of the agents running here; those it still owns.

        Only running agents: a lease this replica id held in an earlier life (before a
        restart) is left to expire, so that someone takes the agent over and runs it.
        A lease that lapsed (this replica was late to renew: a stall, a loaded machine)
        but that nobody took over is still this replica's, and is extended: another
        replica takes a lease only by becoming its owner, and the session's fence
        refuses the writes of an owner it replaced. A draining replica's heartbeat is
        set in the past: it takes no agent handed over, and counts in no fair share.
        """
        pool = await self.store.pool()
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "UPDATE replicas SET heartbeat = CASE WHEN $2 THEN '-infinity' ELSE now() END"
                " WHERE replica_id = $1",
                self.replica_id,
                draining,
            )
            rows = await conn.fetch(
                "UPDATE leases SET expires_at = now() + make_interval(secs => $2)"
                " WHERE owner = $1 AND agent_id = ANY($3::text[])"
                " RETURNING agent_id",
                self.replica_id,
                self.ttl,
                sorted(running),
            )
        return {row["agent_id"] for row in rows}

    async def taken(self, agent_ids: set[str]) -> set[str]:
        """Those of `agent_ids` whose lease another replica holds now (it took them over).

        An agent with no lease at all is not taken: this replica is still acquiring
        it (a creation or a resume in progress) or has just released it (a disposal).
        """
        pool = await self.store.pool()
        rows = await pool.fetch(
            "SELECT agent_id FROM leases WHERE agent_id = ANY($2::text[]) AND owner <> $1",
            self.replica_id,
            sorted(agent_ids),
        )
        return {row["agent_id"] for row in rows}

    async def release(self, agent_id: str) -> None:
        """Give up an agent for good (it was disposed), if this replica still holds it."""
        pool = await self.store.pool()
        await pool.execute(
            "DELETE FROM leases WHERE agent_id = $1 AND owner = $2 AND expires_at > now()",
            agent_id,
            self.replica_id,
        )

    async def hand_over(self) -> None:
        """Expire every lease of this replica now (a graceful stop): others take them."""
        pool = await self.store.pool()
        await pool.execute("UPDATE leases SET expires_at = now() WHERE owner = $1", self.replica_id)

    async def take_over(self, held: Collection[str] = (), expired: bool = True) -> list[Lease]:
        """Take the leases of agents to run here; what was taken.

        Those this replica's id holds but it does not run (handed to it by another
        replica, or held in an earlier life of this id), and with `expired` every
        expired lease (another replica died or stalled). Not those of the agents in
        `held`: this replica runs them (or is creating, resuming or disposing them),
        and its renewal extends their leases. `SKIP LOCKED`: replicas sweeping at the
        same moment split the work, and no lease is taken twice.
        """
        pool = await self.store.pool()
        rows = await pool.fetch(
            "WITH expired AS (SELECT agent_id, owner FROM leases"
            " WHERE (owner = $1 OR ($4 AND expires_at < now()))"
            " AND NOT agent_id = ANY($3::text[]) FOR UPDATE SKIP LOCKED)"
            " UPDATE leases SET owner = $1, expires_at = now() + make_interval(secs => $2)"
            " FROM expired WHERE leases.agent_id = expired.agent_id"
            " RETURNING leases.agent_id, leases.session_id, expired.owner, leases.options",
            self.replica_id,
            self.ttl,
            sorted(held),
            expired,
        )
        return [Lease(r["agent_id"], r["session_id"], r["owner"], r["options"]) for r in rows]

    async def next_expiry(self, held: Collection[str] = ()) -> float | None:
        """Seconds until the first lease another replica holds expires (< 0: one has).

        Not those of the agents in `held` (this replica runs them). None when no other
        replica holds a lease. Measured by the database's clock, as the expiries are.
        """
        pool = await self.store.pool()
        seconds = await pool.fetchval(
            "SELECT extract(epoch FROM min(expires_at) - now())::float8 FROM leases"
            " WHERE owner <> $1 AND NOT agent_id = ANY($2::text[])",
            self.replica_id,
            sorted(held),
        )
        return None if seconds is None else float(seconds)

    async def hand(self, agent_id: str, to: str) -> bool:
        """Give a lease this replica holds to replica `to` (which takes it at its sweep).

        The agent was closed here between two turns; the lease runs a whole lease for
        `to`, so nobody else takes it meanwhile. False when it was not this replica's.
        """
        pool = await self.store.pool()
        owner = await pool.fetchval(
            "UPDATE leases SET owner = $3, expires_at = now() + make_interval(secs => $4)"
            " WHERE agent_id = $1 AND owner = $2 RETURNING owner",
            agent_id,
            self.replica_id,
            to,
            self.ttl,
        )
        return owner is not None

    async def shares(self) -> dict[str, int]:
        """Each replica that takes agents (alive within a lease, not draining): its leases."""
        pool = await self.store.pool()
        rows = await pool.fetch(
            "SELECT replicas.replica_id, count(leases.agent_id) AS agents FROM replicas"
            " LEFT JOIN leases ON leases.owner = replicas.replica_id"
            " WHERE replicas.heartbeat > now() - make_interval(secs => $1)"
            " GROUP BY replicas.replica_id",
            self.ttl,
        )
        return {row["replica_id"]: row["agents"] for row in rows}

    async def address_of(self, replica_id: str) -> str | None:
        """The address replica `replica_id` registered; None for an unknown replica."""
        pool = await self.store.pool()
        address = await pool.fetchval(
            "SELECT address FROM replicas WHERE replica_id = $1", replica_id
        )
        return None if address is None else str(address)

    async def session_owner(self, session_id: str) -> str | None:
        """The replica whose lease names the session, if any, expired or not.

        An expired lease still counts: its agent is between owners (a failover), and
        the sweep gives it a new one; only a disposed agent's lease is gone.
        """
        pool = await self.store.pool()
        owner = await pool.fetchval("SELECT owner FROM leases WHERE session_id = $1", session_id)
        return str(owner) if owner is not None else None

    async def peers(self) -> list[str]:
        """The addresses of the other replicas alive lately (a heartbeat within 3 leases)."""
        pool = await self.store.pool()
        rows = await pool.fetch(
            "SELECT address FROM replicas WHERE replica_id <> $1"
            " AND heartbeat > now() - make_interval(secs => $2) ORDER BY replica_id",
            self.replica_id,
            3 * self.ttl,
        )
        return [row["address"] for row in rows]

    async def listed(self, after: str | None, limit: int) -> list[Lease]:
        """Every lease (live or expired) with an agent id after `after`, by id, `limit` at most.

        Each names a live agent: a disposal deletes its lease.
        """
        pool = await self.store.pool()
        rows = await pool.fetch(
            "SELECT agent_id, session_id, owner, options FROM leases"
            ' WHERE agent_id COLLATE "C" > $1 ORDER BY agent_id COLLATE "C" LIMIT $2',
            after or "",
            limit,
        )
        return [Lease(r["agent_id"], r["session_id"], r["owner"], r["options"]) for r in rows]

    async def locate(self, agent_id: str) -> Location | None:
        """The lease of an agent, expired or not; None when no lease names it."""
        pool = await self.store.pool()
        row = await pool.fetchrow(
            "SELECT leases.owner, coalesce(replicas.address, '') AS address,"
            " leases.expires_at > now() AS live FROM leases"
            " LEFT JOIN replicas ON replicas.replica_id = leases.owner"
            " WHERE leases.agent_id = $1",
            agent_id,
        )
        return None if row is None else Location(row["owner"], row["address"], row["live"])

    async def owner_of(self, agent_id: str) -> Holder | None:
        """The live owner of an agent leased by another replica, if any."""
        holder = await self._holder("agent_id", agent_id)
        if holder is None or holder.owner == self.replica_id:
            return None
        return holder

    async def _holder(self, column: str, value: str) -> Holder | None:
        pool = await self.store.pool()
        row = await pool.fetchrow(
            "SELECT leases.owner, coalesce(replicas.address, '') AS address FROM leases"
            " LEFT JOIN replicas ON replicas.replica_id = leases.owner"
            f" WHERE leases.{column} = $1 AND leases.expires_at > now()",
            value,
        )
        return None if row is None else Holder(row["owner"], row["address"])
