"""The `AgentFactoryService` servicer: a thin adapter over `AgentFactory`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from agentloop.v1 import agent_factory_service_pb2 as pb
from agentloop.v1 import agent_factory_service_pb2_grpc as rpc
from agentloop.v1 import agent_pb2
from server.edge import page_tokens
from server.edge.api_agent_feed import AgentFeedMethods
from server.edge.api_forward import FORWARDED
from server.edge.status import mapped
from server.kernel.errors import FailedPrecondition
from server.kernel.ids import check_id
from server.lifecycle.factory import AgentFactory
from server.loop.agent import Agent
from server.loop.context import usage_message

Context = grpc.aio.ServicerContext[Any, Any]
OtherAgents = Callable[[str | None, int], Awaitable[tuple[list[agent_pb2.Agent], bool]]]
"""The agents other replicas run with ids after a key (at most so many of each), and
whether any of them has more."""
Drain = Callable[[str], Awaitable[pb.DrainReplicaResponse]]
"""Drain the replica of an id ("": this one): its agents handed over, then it stops."""


def agent_key(agent: agent_pb2.Agent) -> str:
    """The sort and page key of an agent: its id."""
    return agent.agent_id


def once_each(agents: list[agent_pb2.Agent]) -> list[agent_pb2.Agent]:
    """Agents sorted by id, each once: during a move two replicas may both list one."""
    kept: list[agent_pb2.Agent] = []
    for agent in agents:
        if kept and kept[-1].agent_id == agent.agent_id:
            if kept[-1].moving and not agent.moving:
                kept[-1] = agent
            continue
        kept.append(agent)
    return kept


def agent_message(agent: Agent, lineage: agent_pb2.Lineage | None = None) -> agent_pb2.Agent:
    """The `Agent` resource of a live agent."""
    return agent_pb2.Agent(
        agent_id=agent.agent_id,
        session_id=agent.session.session_id,
        status=agent.status,
        options=agent.options,
        create_time=agent.create_time,
        pending_approvals=agent.approvals.list(),
        context_usage=usage_message(agent.session, agent.context),
        lineage=lineage,
        resolved_provider=agent.resolved_provider,
        resolved_model=agent.resolved_model,
    )


class AgentFactoryServicer(AgentFeedMethods, rpc.AgentFactoryServiceServicer):
    """Creates, resumes, inspects and disposes agents."""

    def __init__(self, factory: AgentFactory) -> None:
        self.factory = factory
        self.elsewhere: OtherAgents | None = None
        """Replicas: the agents the other replicas run, to list every agent from any."""
        self.drain: Drain | None = None
        """Replicas: hand a replica's agents over to the others, then stop it."""

    def _message(self, agent: Agent) -> agent_pb2.Agent:
        return agent_message(agent, self.factory.family.message(agent.agent_id))

    @mapped
    async def CreateAgent(
        self, request: pb.CreateAgentRequest, context: Context
    ) -> pb.CreateAgentResponse:
        """Create an agent on a new session."""
        agent = await self.factory.create(
            request.agent_id,
            request.options,
            session_id=request.session_id,
            cwd=request.metadata.cwd,
            parent=request.parent if request.HasField("parent") else None,
            seed=request.seed if request.HasField("seed") else None,
        )
        return pb.CreateAgentResponse(agent=self._message(agent))

    @mapped
    async def ResumeAgent(
        self, request: pb.ResumeAgentRequest, context: Context
    ) -> pb.ResumeAgentResponse:
        """Create an agent over an existing session."""
        options = request.options if request.HasField("options") else None
        agent = await self.factory.resume(request.agent_id, request.session_id, options)
        return pb.ResumeAgentResponse(agent=self._message(agent))

    @mapped
    async def DisposeAgent(
        self, request: pb.DisposeAgentRequest, context: Context
    ) -> pb.DisposeAgentResponse:
        """Dispose an agent."""
        agent = self.factory.get(request.agent_id)
        lineage = self.factory.family.message(agent.agent_id)  # before it leaves the tree
        await self.factory.dispose(request.agent_id)
        return pb.DisposeAgentResponse(agent=agent_message(agent, lineage))

    @mapped
    async def GetAgent(self, request: pb.GetAgentRequest, context: Context) -> pb.GetAgentResponse:
        """Describe one live agent."""
        return pb.GetAgentResponse(agent=self._message(self.factory.get(request.agent_id)))

    @mapped
    async def ListAgents(
        self, request: pb.ListAgentsRequest, context: Context
    ) -> pb.ListAgentsResponse:
        """List live agents by id, a page at a time."""
        size = page_tokens.check_page_size(request.page_size, 100, 1000)
        after = page_tokens.last_key(request.page_token, "ListAgents")
        children = None
        if request.parent_agent_id:
            check_id("parent_agent_id", request.parent_agent_id)
            children = set(self.factory.family.children(request.parent_agent_id))
        agents = [
            self._message(a)
            for a in self.factory.list_agents()
            if (after is None or a.agent_id > after)
            and (children is None or a.agent_id in children)
        ]
        forwarded = any(k == FORWARDED for k, _ in context.invocation_metadata() or ())
        remote_more = False
        if (
            self.elsewhere is not None and not forwarded and children is None
        ):  # merged by id, keyset over all
            remote, remote_more = await self.elsewhere(after, size)
            agents = once_each(sorted([*agents, *remote], key=agent_key))
        page = agents[:size]
        more = len(agents) > size or remote_more
        next_token = page_tokens.issue("ListAgents", page[-1].agent_id) if more else ""
        return pb.ListAgentsResponse(agents=page, next_page_token=next_token)

    @mapped
    async def DrainReplica(
        self, request: pb.DrainReplicaRequest, context: Context
    ) -> pb.DrainReplicaResponse:
        """Hand a replica's agents over to the other replicas between turns; it stops."""
        if self.drain is None:
            raise FailedPrecondition(
                "this server is not a replica (store: postgres): it has nothing to drain to",
                "NOT_REPLICATED",
            )
        return await self.drain(request.replica_id)
