"""Replicas over one PostgreSQL store: leases, renewal, and takeover of orphaned agents.

Each replica registers itself and owns the agents it created or resumed through
leases (`server.stores.postgres_leases`). Two background loops run while it serves:
- renewal, every third of the lease time: the leases of the agents it holds (live,
  being created or resumed, or taken over and waiting for their resume) are
  extended, also one that lapsed while nobody took it; an agent whose lease was
  lost (this replica stalled past its expiry and another took it) is stopped here at
  once, and the store's fence already refuses its writes;
- the sweep, every half of the lease time: expired leases (a replica died) are taken
  over, never those of agents this replica holds; each agent is resumed here on its
  session, which repairs a turn the crash left open and runs the pending inbox once.
  A lease taken over is renewed from the moment it is taken, so that a sweep that
  takes many (a replica with many agents died) keeps them all while it resumes them
  one by one.
A graceful stop hands every lease over (expires it), so others take its agents now.

The renew deadline (two thirds of the lease, as Kubernetes' `renewDeadline`): once the
renewal loop runs, a replica whose last renewal began longer ago than that stops
acting for its agents (`acting`): the store refuses its commits (retried as an outage)
and calls for its agents are routed by the leases (`AGENT_MOVING` while its own lease
is in doubt). The lease can only expire elsewhere a third of a lease later, so an
owner that was paused, partitioned or cut off from the database has stopped before
another replica may take its agents; it acts again after a renewal that kept them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from agentloop.v1 import agent_pb2
from server.kernel.errors import AlreadyExists, FailedPrecondition
from server.kernel.tasks import cancel_and_wait
from server.stores import StoreUnavailable
from server.stores.postgres_leases import Holder, Lease, Leases

log = logging.getLogger(__name__)

RENEW_DEADLINE = 2 / 3
"""Of the lease time: how long after its last renewal began a replica still acts."""

Resume = Callable[[Lease], Awaitable[None]]
Abandon = Callable[[str], Awaitable[None]]
Owned = Callable[[], set[str]]


class Cluster:
    """One replica's share of the agents."""

    def __init__(self, leases: Leases) -> None:
        self.leases = leases
        self.replica_id = leases.replica_id
        self._tasks: list[asyncio.Task[None]] = []
        self._owned: Owned = set
        self._taking: set[str] = set()
        """Agents whose leases the sweep took and has not resumed yet (renewed meanwhile)."""
        self._renewal: asyncio.Task[None] | None = None
        self._renewed_at = time.monotonic()
        """When the last successful renewal began (the leases it kept run a lease from then)."""
        self._late: asyncio.TimerHandle | None = None
        """Fires at the renew deadline unless a renewal succeeds first: says so in the log."""
        self._stopped = False
        """Whether the deadline passed (and was logged) since the last renewal in time."""

    # -- Ownership ---------------------------------------------------------------------

    async def acquire(
        self, agent_id: str, session_id: str, options: agent_pb2.AgentOptions
    ) -> None:
        """Take the lease of a new live agent, or say who has it."""
        holder = await self.leases.acquire(agent_id, session_id, options.SerializeToString())
        if holder is None:
            return
        if agent_id in self._taking:  # this replica's sweep took it and resumes it now
            raise AlreadyExists(f'agent "{agent_id}" is live: this replica is taking it over')
        where = f' on replica "{holder.owner}"' if holder.owner else ""
        if await self.leases.owner_of(agent_id) is not None:
            raise AlreadyExists(f'agent "{agent_id}" is live{where}')
        raise FailedPrecondition(f'session "{session_id}" is driven by another agent{where}')

    async def release(self, agent_id: str) -> None:
        """The agent was disposed: delete its lease."""
        await self.leases.release(agent_id)

    async def still_driven(self, session_id: str) -> bool:
        """Whether the session's agent lives on, elsewhere or between owners."""
        return await self.leases.session_owner(session_id) is not None

    async def owner_of(self, agent_id: str) -> Holder | None:
        """The replica that owns `agent_id`, when it is another one."""
        return await self.leases.owner_of(agent_id)

    # -- the loops ---------------------------------------------------------------------

    def acting(self) -> bool:
        """Whether this replica may act for its agents: its renewal is not past the deadline.

        Always before the renewal runs (the config agents' leases were just taken) and
        after it stopped for a hand-over (the agents are closing; the fence holds).
        """
        if self._renewal is None:
            return True
        return time.monotonic() - self._renewed_at < RENEW_DEADLINE * self.leases.ttl

    def _renewed(self, started: float) -> None:
        self._renewed_at = max(self._renewed_at, started)
        delay = self._renewed_at + RENEW_DEADLINE * self.leases.ttl - time.monotonic()
        if delay <= 0:  # a renewal that took past the deadline: still not acting
            return
        if self._late is not None:
            self._late.cancel()
        elif self._stopped:
            self._stopped = False
            log.warning("cluster: renewed again; acting for this replica's agents")
        self._late = asyncio.get_running_loop().call_later(delay, self._past_deadline)

    def _past_deadline(self) -> None:
        self._late = None
        self._stopped = True
        log.warning(
            "cluster: no lease renewal for %.2f s (the renew deadline): this replica stops"
            " acting for its agents until a renewal succeeds",
            RENEW_DEADLINE * self.leases.ttl,
        )

    async def register(self) -> None:
        """Record this replica and its address (before it creates any agent)."""
        await self.leases.register()

    def start(self, owned: Owned, resume: Resume, abandon: Abandon) -> None:
        """Renew and sweep in the background.

        Called once the config agents exist: a sweep racing their creation would take
        one over as it is being created. `owned` names the agents this replica holds:
        live, being created or resumed, or being disposed.
        """
        ttl = self.leases.ttl
        self._owned = owned
        self._renewed_at = time.monotonic()
        self._renewal = asyncio.create_task(self._every(ttl / 3, lambda: self._renew(abandon)))
        self._tasks = [asyncio.create_task(self._every(ttl / 2, lambda: self._sweep(resume)))]

    async def stop(self) -> None:
        """Take no more agents over (a stop: the agents are about to close; renewal goes on)."""
        await cancel_and_wait(self._tasks)
        self._tasks = []

    async def hand_over(self) -> None:
        """Stop renewing; expire this replica's leases (a graceful stop, its turns closed)."""
        await self.stop_renewal()
        await self.leases.hand_over()

    async def stop_renewal(self) -> None:
        """Stop the renewal loop (the last step of a stop)."""
        if self._renewal is not None:
            await cancel_and_wait([self._renewal])
            self._renewal = None
        if self._late is not None:
            self._late.cancel()
            self._late = None

    async def _every(self, seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await work()
            except StoreUnavailable:  # the database is away for a moment: try again
                log.warning("cluster: the store is unreachable; retrying")
            except Exception:
                log.warning("cluster: %s failed; retrying", work, exc_info=True)
            await asyncio.sleep(seconds)

    async def _renew(self, abandon: Abandon) -> None:
        running = self._owned() | self._taking
        started = time.monotonic()
        kept = await self.leases.renew(running)
        self._renewed(started)
        missing = running - kept
        for agent_id in sorted(await self.leases.taken(missing) if missing else ()):
            if agent_id in self._taking:  # taken over elsewhere before it was resumed here
                self._taking.discard(agent_id)
                log.warning("cluster: the lease of agent %s was lost before its resume", agent_id)
                continue
            log.warning("cluster: the lease of agent %s was lost; stopping it here", agent_id)
            await abandon(agent_id)

    async def _sweep(self, resume: Resume) -> None:
        leases = await self.leases.take_over(self._owned())
        self._taking.update(lease.agent_id for lease in leases)
        for lease in leases:
            if lease.agent_id not in self._taking:
                continue  # its lease was lost meanwhile: another replica runs it
            log.info(
                "cluster: taking over agent %s (session %s) from %s",
                lease.agent_id,
                lease.session_id,
                lease.owner,
            )
            try:
                await resume(lease)
            except (AlreadyExists, FailedPrecondition, StoreUnavailable) as error:
                # Busy here (being disposed, or resumed by a call), or the store is (a row
                # still locked, an outage): the lease lapses, and a later sweep takes the
                # agent again if nobody runs it by then. Never released: the agent lives.
                log.warning("cluster: taking over agent %s deferred: %s", lease.agent_id, error)
            except Exception:
                log.error("cluster: taking over agent %s failed", lease.agent_id, exc_info=True)
                await self.leases.release(lease.agent_id)
            finally:
                self._taking.discard(lease.agent_id)
