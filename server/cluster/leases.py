"""Replicas over one PostgreSQL store: leases, renewal, and takeover of orphaned agents.

Each replica registers itself and owns the agents it created or resumed through
leases (`server.stores.postgres_leases`). Two background loops run while it serves:
- renewal, every third of the lease time: the leases of the agents it holds (live,
  being created or resumed, or taken over and waiting for their resume) are
  extended, also one that lapsed while nobody took it; an agent whose lease was
  lost (this replica stalled past its expiry and another took it) is stopped here at
  once, and the store's fence already refuses its writes;
- the sweep, at the earliest expiry of another replica's lease (read from the
  database after each sweep), and at least every half of the lease time: expired
  leases (a replica died) are taken over, never those of agents this replica holds,
  and never before this replica has been in touch with the database for a whole
  lease (the *grace*); each agent is resumed here on its session, which repairs a
  turn the crash left open and runs the pending inbox once. Sweeping at the expiry
  rather than on a fixed period is what holds the failover bound: a dead owner's
  agents are taken over as soon as their leases run out, within a lease of its last
  renewal, plus the resume.
  A lease taken over is renewed from the moment it is taken, so that a sweep that
  takes many (a replica with many agents died) keeps them all while it resumes them,
  a few at a time: those a client asked for meanwhile (a call refused `AGENT_MOVING`
  here, `wanted`) first, so the agents someone waits for are not queued behind idle
  ones.
Agents also move between turns (issue 27 item 7): a lease can be handed to a named
replica, which resumes the agent at its next sweep (a sweep takes every lease its id
holds and it does not run: handed to it, or held in an earlier life of the id). The
rebalance, every two leases, hands agents from a replica above its fair share to the
replicas with fewer (`balance.py`); a drain (`DrainReplica`, or a stop) hands every
agent away, and marks this replica as taking none. Each hand-over closes the agent
here once it is idle (the factory's `hand_off`), renewing its lease until it is given.
A graceful stop then expires the leases it still holds, so others take those now.

The grace (issue 27 item 4): during a database outage every lease lapses, the live
owners' too. The owners renew them when the database is back (a lapsed lease nobody
took is still its owner's), so a sweeper must not take them first: after an outage of
its own (a renewal that failed) a replica sweeps again only once its renewals have
succeeded for a whole lease; every owner that reconnected within that lease has
renewed its leases by then. A replica
that was in touch all along (a peer died, the database did not blink) sweeps at once,
so the failover bound for a real death is unchanged.

The renew deadline (two thirds of the lease, as Kubernetes' `renewDeadline`): once the
renewal loop runs, a replica whose last renewal began longer ago than that stops
acting for its agents (`acting`): the store refuses its commits (retried as an outage)
and calls for its agents are routed by the leases (`AGENT_MOVING` while its own lease
is in doubt), and its agents' steps wait (`until_acting`). The lease can only expire
elsewhere a third of a lease later, so an owner that was paused, partitioned or cut
off from the database has stopped before another replica may take its agents; it
acts again after a renewal that kept them, and only once it has stopped the agents
that renewal says another replica took (a woken owner never serves a call or runs a
step for an agent it lost).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from agentloop.v1 import agent_pb2
from server.cluster.balance import drain_targets, hand_outs
from server.cluster.routing import AgentMoving, takeover_seconds
from server.kernel.errors import AlreadyExists, FailedPrecondition, SessionNotFound
from server.kernel.tasks import cancel_and_wait
from server.stores import StoreUnavailable
from server.stores.postgres_leases import Holder, Lease, Leases

log = logging.getLogger(__name__)

RENEW_DEADLINE = 2 / 3
"""Of the lease time: how long after its last renewal began a replica still acts."""

SWEEP_AT_LEAST = 1 / 20
"""Of the lease time: the shortest wait between two sweeps (an expired lease still locked)."""

EXPIRY_MARGIN = 0.005
"""Seconds past a lease's expiry that the sweep looks (the expiry is exclusive)."""

RESUMES_AT_ONCE = 4
"""Agents a sweep resumes concurrently (a replica with many agents died)."""

WANTED_AT_MOST = 10_000
"""Agents remembered as asked for between sweeps (a flood of unknown ids is forgotten)."""

REBALANCE_EVERY = 2
"""Leases between two looks at the fair shares."""

HAND_OFF_WAIT = 10.0
"""Seconds a rebalance waits for an agent's turn to end before it keeps the agent."""

Resume = Callable[[Lease], Awaitable[None]]
Abandon = Callable[[str], Awaitable[None]]
Lose = Callable[[str], None]
"""Stop acting for an agent at once (no await): its calls routed, its writes and steps
stopped; `Abandon` then tears it down."""
Owned = Callable[[], set[str]]
HandOff = Callable[[str, float], Awaitable[bool]]
"""Close a live agent here between two turns (waiting at most so long); whether it closed."""
Movable = Callable[[], list[str]]
"""The agents that may move to another replica, those between turns first."""


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
        self._giving: set[str] = set()
        """Agents being handed to another replica (renewed here until the lease is given)."""
        self._draining = False
        """Whether this replica gives every agent away (a drain, a stop): it takes none."""
        self._hand_off: HandOff | None = None
        self._lose: Lose = lambda agent_id: None
        self._movable: Movable = list
        self._wanted: set[str] = set()
        """Agents a call asked for here while they were between owners (resumed first)."""
        self._acting_again = asyncio.Event()
        """Set by a renewal in time: wakes the steps that wait in `until_acting`."""
        self._in_touch_since: float | None = time.monotonic() - leases.ttl
        """Since when renewals have succeeded without a gap; None during an outage.

        A replica starts settled: it has just registered, and saw no outage.
        """

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

    async def confirm(
        self, agent_id: str, session_id: str, options: agent_pb2.AgentOptions
    ) -> None:
        """Still hold the lease as the agent goes live here (its session is stored now).

        A creation late past its lease may have lost it meanwhile: to a sweep whose
        resume found no session yet, which released it (taken again here), or to
        another replica that holds it live now (`AgentMoving`: the caller may retry).
        """
        holder = await self.leases.confirm(agent_id, session_id, options.SerializeToString())
        if holder is not None:
            log.warning("cluster: agent %s went to %r as it went live", agent_id, holder.owner)
            raise AgentMoving(agent_id, takeover_seconds(self.leases.ttl))

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

    async def until_acting(self) -> None:
        """Return once this replica may act for its agents (a step waits here first)."""
        while not self.acting():
            self._acting_again.clear()
            await self._acting_again.wait()

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
        self._acting_again.set()

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

    def start(
        self,
        owned: Owned,
        resume: Resume,
        abandon: Abandon,
        hand_off: HandOff | None = None,
        movable: Movable = list,
        lose: Lose | None = None,
    ) -> None:
        """Renew, sweep and rebalance in the background.

        Called once the config agents exist: a sweep racing their creation would take
        one over as it is being created. `owned` names the agents this replica holds:
        live, being created or resumed, or being disposed; `hand_off` closes one between
        turns so that another replica takes it (no rebalancing without it). An agent
        whose lease another replica took is stopped with `lose` before this replica
        acts again, then torn down with `abandon`.
        """
        ttl = self.leases.ttl
        self._owned = owned
        self._hand_off = hand_off
        self._movable = movable
        if lose is not None:
            self._lose = lose
        self._renewed_at = time.monotonic()
        self._renewal = asyncio.create_task(self._every(ttl / 3, lambda: self._renew(abandon)))
        self._tasks = [asyncio.create_task(self._sweeping(resume))]
        if hand_off is not None:
            self._tasks.append(
                asyncio.create_task(self._every(REBALANCE_EVERY * ttl, self._rebalance))
            )

    # -- hand-over between turns -------------------------------------------------------

    async def give(self, agent_id: str, to: str, wait: float) -> bool:
        """Close `agent_id` here between two turns and give its lease to replica `to`.

        Its lease is renewed here until it is given, so no sweep takes it meanwhile;
        `to` resumes it at its next sweep. False when the agent stayed (its turn did not
        end within `wait`, or it is no longer here).
        """
        if self._hand_off is None:
            return False
        self._giving.add(agent_id)
        try:
            if not await self._hand_off(agent_id, wait):
                return False
            if not await self.leases.hand(agent_id, to):
                return False
            log.info("cluster: handed agent %s over to %s", agent_id, to)
            return True
        finally:
            self._giving.discard(agent_id)

    async def _rebalance(self) -> None:
        """Give agents to the replicas with fewer, while this one holds more than its share."""
        if self._draining or not self.settled():
            return
        targets = hand_outs(await self.leases.shares(), self.replica_id)
        if not targets:
            return
        movable = [a for a in self._movable() if a not in self._taking][: len(targets)]
        log.info("cluster: rebalancing: handing %d agent(s) over", len(movable))
        await asyncio.gather(
            *(
                self.give(agent_id, to, HAND_OFF_WAIT)
                for agent_id, to in zip(movable, targets, strict=False)
            )
        )

    async def drain(self, wait: float) -> list[str]:
        """Hand every movable agent over to the other replicas between turns; those handed.

        From here on this replica takes no agent (its heartbeat says so, and it stops
        sweeping and rebalancing). `FailedPrecondition` when no other replica takes agents.
        """
        if not set(await self.leases.shares()) - {self.replica_id}:  # checked first: a
            # refused drain leaves this replica as it was
            raise FailedPrecondition(
                "no other live replica takes agents: nothing to drain to", "NO_REPLICA"
            )
        self._draining = True
        await self.stop()
        await self.leases.renew(self._owned() | self._taking, draining=True)
        shares = await self.leases.shares()  # this replica is out of them now
        shares.pop(self.replica_id, None)
        agents = self._movable()
        log.info("cluster: draining %d agent(s) to %s", len(agents), ", ".join(sorted(shares)))
        handed = await asyncio.gather(
            *(
                self.give(agent_id, to, wait)
                for agent_id, to in zip(agents, drain_targets(shares, len(agents)), strict=False)
            )
        )
        return [agent_id for agent_id, done in zip(agents, handed, strict=False) if done]

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
        self._acting_again.set()  # acting from now on (the fence holds): no step waits

    async def _every(self, seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await work()
            except StoreUnavailable:  # the database is away for a moment: try again
                log.warning("cluster: the store is unreachable; retrying")
            except Exception:
                log.warning("cluster: %s failed; retrying", work, exc_info=True)
            await asyncio.sleep(seconds)

    async def _sweeping(self, resume: Resume) -> None:
        """Sweep; again at the next expiry of another replica's lease, half a lease at most."""
        while True:
            wait = self.leases.ttl / 2
            try:
                await self._sweep(resume)
                wait = await self.next_sweep()
            except StoreUnavailable:
                log.warning("cluster: the store is unreachable; retrying")
            except Exception:
                log.warning("cluster: the sweep failed; retrying", exc_info=True)
            await asyncio.sleep(wait)

    async def next_sweep(self) -> float:
        """Seconds until the next sweep: at the first expiry it may take, half a lease at most.

        Half a lease at most for the leases handed to this replica (and for new leases
        of other replicas, which expire a whole lease from now at the earliest). Before
        it has settled (the grace) at the end of the grace; then at the first expiry.
        """
        ttl = self.leases.ttl
        longest, shortest = ttl / 2, SWEEP_AT_LEAST * ttl
        since = self._in_touch_since
        if since is None:
            return longest
        if not self.settled():
            return min(longest, max(since + ttl - time.monotonic(), shortest))
        expiry = await self.leases.next_expiry(self._owned() | self._giving)
        if expiry is None:
            return longest
        return min(longest, max(expiry + EXPIRY_MARGIN, shortest))

    def settled(self) -> bool:
        """Whether this replica has been in touch with the database for a whole lease."""
        since = self._in_touch_since
        return since is not None and time.monotonic() - since >= self.leases.ttl

    async def _renew(self, abandon: Abandon) -> None:
        running = self._owned() | self._taking | self._giving
        started = time.monotonic()
        try:
            kept = await self.leases.renew(running, self._draining)
        except BaseException:
            self._lost_touch()
            raise
        if self._in_touch_since is None:
            self._in_touch_since = started
            log.info("cluster: in touch with the database again; no takeover for one lease")
        # The lost agents are stopped before this replica acts again: woken from a
        # pause past its lease, it must not serve a call or run a step for an agent
        # another replica runs now (the fence would refuse its writes, but too late
        # for a client told OK, or for a tool that ran twice). At once, not after their
        # teardowns: those may wait for commits that wait for this replica to act.
        missing = running - kept
        lost = []
        for agent_id in sorted(await self.leases.taken(missing) if missing else ()):
            if agent_id in self._taking:  # taken over elsewhere before it was resumed here
                self._taking.discard(agent_id)
                log.warning("cluster: the lease of agent %s was lost before its resume", agent_id)
                continue
            if agent_id not in self._owned():
                continue  # handed over (or gone) while this renewal ran: nothing to stop
            log.warning("cluster: the lease of agent %s was lost; stopping it here", agent_id)
            self._lose(agent_id)
            lost.append(agent_id)
        self._renewed(started)
        await asyncio.gather(*(abandon(agent_id) for agent_id in lost))

    def _lost_touch(self) -> None:
        self._in_touch_since = None

    def wanted(self, agent_id: str) -> None:
        """A call asked for `agent_id` while it was between owners: resume it first."""
        if len(self._wanted) >= WANTED_AT_MOST:
            self._wanted.clear()
        self._wanted.add(agent_id)

    async def _sweep(self, resume: Resume) -> None:
        # After an outage only the leases handed to this replica: the live owners renew
        # their lapsed ones first.
        held = self._owned() | self._giving
        leases = await self.leases.take_over(held, expired=self.settled())
        wanted, self._wanted = self._wanted, set()
        leases.sort(key=lambda lease: lease.agent_id not in wanted)  # stable: asked-for first
        self._taking.update(lease.agent_id for lease in leases)
        at_once = asyncio.Semaphore(RESUMES_AT_ONCE)  # a few at a time: the pool is shared
        await asyncio.gather(*(self._take(lease, resume, at_once) for lease in leases))

    async def _take(self, lease: Lease, resume: Resume, at_once: asyncio.Semaphore) -> None:
        """Resume one agent whose lease the sweep took (unless it was lost meanwhile)."""
        async with at_once:
            if lease.agent_id not in self._taking:
                return  # its lease was lost meanwhile: another replica runs it
            if lease.owner == self.replica_id:  # handed here, or held in an earlier life
                log.info("cluster: resuming agent %s, leased to this replica", lease.agent_id)
            else:
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
            except SessionNotFound:
                # Its creator died before storing its session, or is late (stalled past
                # the lease): given up; a late creator holds it again once it stores it.
                log.warning("cluster: agent %s has no stored session: not taken", lease.agent_id)
                await self.leases.release(lease.agent_id)
            except Exception:
                log.error("cluster: taking over agent %s failed", lease.agent_id, exc_info=True)
                await self.leases.release(lease.agent_id)
            finally:
                self._taking.discard(lease.agent_id)
