"""A server as one replica among many over PostgreSQL: its part of the start and stop.

`store: postgres` makes every server a replica. Before it serves it registers itself,
becomes the factory's ownership (agents by lease) and shares plugin registrations;
once its config agents exist it renews its leases, takes orphaned agents over and
connects to the plugins other replicas registered; on a graceful stop it stops those
loops before its agents close, then hands its leases over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import grpc

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2
from server.cluster.leases import Cluster
from server.cluster.routing import AgentMoving, Router
from server.edge import page_tokens
from server.edge.api_forward import Forwarder
from server.edge.api_plugins import PluginRegistryServicer, overrides_of
from server.kernel.errors import AgentLoopError, FailedPrecondition, NotFound
from server.kernel.ids import check_id
from server.kernel.tasks import cancel_and_wait
from server.lifecycle.factory import AgentFactory
from server.plugins.registry import PluginRegistry
from server.settings.config import Config
from server.stores import StoreUnavailable
from server.stores.postgres import PostgresStore
from server.stores.postgres_leases import Lease, Leases
from server.stores.postgres_plugins import SharedPlugins

log = logging.getLogger(__name__)

LIST_AGENTS = "/agentloop.v1.AgentFactoryService/ListAgents"
DRAIN = "/agentloop.v1.AgentFactoryService/DrainReplica"

DRAIN_WAIT = 60.0
"""Seconds a drain waits for an agent's turn to end before the stop closes it."""

LIST_WAIT = 1 / 3
"""Of the lease time: how long `ListAgents` waits for another replica's page. A peer
that does not answer by then (paused, cut off) has its agents listed from their leases,
as moving: a listing is never held up by one replica for long."""


class Replica:
    """The cluster side of one server."""

    def __init__(
        self,
        config: Config,
        store: PostgresStore,
        factory: AgentFactory,
        plugins: PluginRegistry,
        plugin_servicer: PluginRegistryServicer,
        token: str = "",
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.factory = factory
        self.plugins = plugins
        self.plugin_servicer = plugin_servicer
        self.cluster: Cluster | None = None
        self.router: Router | None = None
        self.forwarder = Forwarder(
            self.serves,
            self.owner_address,
            self.moving,
            token,
            credentials,
            watch_seconds=config.lease_seconds / 3,
        )
        self.shared = SharedPlugins(store)
        self._plugin_sync: asyncio.Task[None] | None = None
        self.drained = asyncio.Event()
        """Set once a `DrainReplica` handed this replica's agents over: the server stops."""

    async def join(self, port: int) -> None:
        """Register (before serving agents): ownership by lease, shared plugins."""
        host = self.config.listen.rpartition(":")[0]
        address = self.config.advertise_address or f"{host}:{port}"
        replica_id = self.config.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        leases = Leases(self.store, replica_id, address, self.config.lease_seconds)
        self.cluster = Cluster(leases)
        self.store.may_write = self.cluster.acting
        self.factory.runtime.until_acting = self.cluster.until_acting
        self.router = Router(replica_id, leases.locate, self.config.lease_seconds)
        self.factory.ownership = self.cluster
        self.factory.catalogue.repair_on_read = False  # another replica's running turn looks open
        self.factory.catalogue.live_may_lag = True  # another replica may have taken one over
        await self.cluster.register()
        self.plugin_servicer.shared = self.shared
        log.info("replica %s serving at %s", replica_id, address)

    def run(self) -> None:
        """Renew leases, take orphaned agents over, follow shared plugins (background)."""
        assert self.cluster is not None
        # Imported here: a single server (most starts) never takes an agent over.
        from server.lifecycle.orphans import retire_child

        async def take_over(lease: Lease) -> None:
            if await retire_child(self.factory, lease.agent_id, lease.session_id):
                return  # a child never outlives its owner: disposed, not resumed
            # The agent's options are stored with its session: restore them.
            await self.factory.resume(lease.agent_id, lease.session_id, None, owned=True)

        self.cluster.start(
            self.factory.held,
            take_over,
            self.factory.abandon,
            self.factory.hand_off,
            self.factory.movable,
            self.factory.lose,
        )
        self._plugin_sync = asyncio.create_task(self._sync_plugins())

    async def stop_loops(self) -> None:
        """No takeover, no plugin sync: the agents are about to close (renewal goes on)."""
        if self._plugin_sync is not None:
            await cancel_and_wait([self._plugin_sync])
        if self.cluster is not None:
            await self.cluster.stop()

    async def drain(self, replica_id: str) -> fac.DrainReplicaResponse:
        """Hand the agents of replica `replica_id` ("": this one) over; then it stops."""
        assert self.cluster is not None
        if replica_id and replica_id != self.cluster.replica_id:
            check_id("replica_id", replica_id)
            address = await self.cluster.leases.address_of(replica_id)
            if address is None:
                raise NotFound(
                    f'replica_id: no replica "{replica_id}" ever joined',
                    "REPLICA_NOT_FOUND",
                    field="replica_id",
                )
            request = fac.DrainReplicaRequest(replica_id=replica_id)
            answer: fac.DrainReplicaResponse = await self.forwarder.ask(
                address, DRAIN, request, fac.DrainReplicaResponse, DRAIN_WAIT + 10
            )
            return answer
        handed = await self.cluster.drain(DRAIN_WAIT)
        log.info("drained: %d agent(s) handed over; stopping", len(handed))
        self.drained.set()
        return fac.DrainReplicaResponse(replica_id=self.cluster.replica_id, agent_ids=handed)

    async def hand_over_between_turns(self, wait: float) -> None:
        """A graceful stop: hand each agent over between turns, within `wait` seconds."""
        if self.cluster is None:
            return
        try:
            handed = await self.cluster.drain(wait)
        except FailedPrecondition:  # the last replica: its agents wait for the next start
            return
        except Exception:
            log.warning("handing the agents over between turns failed", exc_info=True)
            return
        log.info("stopping: %d agent(s) handed over between turns", len(handed))

    async def hand_over(self) -> None:
        """Expire this replica's leases: the others take its agents at once."""
        if self.cluster is None:
            return
        try:
            await self.cluster.hand_over()
        except Exception:
            log.warning("handing the agents over failed; they move at lease expiry")

    async def close(self) -> None:
        """Close the channels to the other replicas."""
        await self.forwarder.close()

    def serves(self, agent_id: str) -> bool:
        """Whether this replica answers for `agent_id` itself: it runs it, and may act."""
        acting = self.cluster is None or self.cluster.acting()
        return acting and self.factory.serves(agent_id)

    async def owner_address(self, agent_id: str, forwarded: bool) -> str | None:
        """Where the replica that owns `agent_id` listens; None: here; `AgentMoving`."""
        if self.router is None:
            return None
        try:
            return await self.router.owner_address(agent_id, forwarded)
        except AgentMoving:
            self._wanted(agent_id)
            raise

    def moving(self, agent_id: str) -> AgentLoopError:
        """The refusal of a call for `agent_id` whose owner did not answer."""
        self._wanted(agent_id)
        return AgentMoving(agent_id, self.router.retry_seconds if self.router else 1.0)

    def _wanted(self, agent_id: str) -> None:
        """A client waits for `agent_id`: should this replica take it over, resume it first."""
        if self.cluster is not None:
            self.cluster.wanted(agent_id)

    async def other_agents(
        self, after: str | None, size: int
    ) -> tuple[list[agent_pb2.Agent], bool]:
        """The agents other live replicas run, with ids after `after` (`size` each).

        Also whether any of them has more than it returned. Then the agents between
        owners (a lease that no replica's answer covers: its owner stopped or did not
        answer, and nobody took it over yet), marked `moving`: a live agent is listed
        during a move too.
        """
        if self.cluster is None:
            return [], False
        here = {a.agent_id for a in self.factory.list_agents()}  # as the caller listed them
        agents, more = await self._answered(after, size)
        listed = here | {a.agent_id for a in agents}
        leases = await self.cluster.leases.listed(after, size + 1)
        for lease in leases[:size]:
            if lease.agent_id not in listed:
                agents.append(moving_agent(lease))
        return agents, more or len(leases) > size

    async def _answered(self, after: str | None, size: int) -> tuple[list[agent_pb2.Agent], bool]:
        """The agents other replicas listed, with ids after `after`; whether one had more."""
        assert self.cluster is not None
        request = fac.ListAgentsRequest(
            page_size=size, page_token=page_tokens.issue("ListAgents", after) if after else ""
        )
        wait = LIST_WAIT * self.config.lease_seconds
        answers = await asyncio.gather(
            *(
                self.forwarder.ask(address, LIST_AGENTS, request, fac.ListAgentsResponse, wait)
                for address in await self.cluster.leases.peers()
            ),
            return_exceptions=True,
        )
        agents: list[agent_pb2.Agent] = []
        more = False
        for answer in answers:  # a replica that does not answer now is left out
            if isinstance(answer, fac.ListAgentsResponse):
                agents.extend(answer.agents)
                more = more or bool(answer.next_page_token)
        return agents, more

    async def _sync_plugins(self) -> None:
        """Connect to the plugins other replicas registered; drop those they removed."""
        shared = self.shared
        while True:
            try:
                wanted = await shared.all()
                for name, request in sorted(wanted.items()):
                    if name not in self.plugins.plugins:
                        try:
                            await self.plugins.register(request.address, overrides_of(request))
                            shared.here.add(name)
                        except Exception as error:  # it may come up later: the next pass
                            log.warning("shared plugin %s not registered: %s", name, error)
                for name in sorted(shared.here - set(wanted)):
                    shared.here.discard(name)
                    if name in self.plugins.plugins:
                        await self.plugins.unregister(name)
            except StoreUnavailable:  # the database is away for a moment
                log.warning("syncing the shared plugins: the store is unreachable; retrying")
            except Exception:
                log.warning("syncing the shared plugins failed; retrying", exc_info=True)
            await asyncio.sleep(self.config.lease_seconds)


def moving_agent(lease: Lease) -> agent_pb2.Agent:
    """A live agent between owners, as its lease knows it."""
    agent = agent_pb2.Agent(agent_id=lease.agent_id, session_id=lease.session_id, moving=True)
    agent.options.ParseFromString(lease.options)
    return agent
