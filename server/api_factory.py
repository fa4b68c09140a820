"""The `AgentFactoryService` servicer: a thin adapter over `AgentFactory`."""

from __future__ import annotations

from typing import Any

import grpc

from agentloop.v1 import agent_factory_service_pb2 as pb
from agentloop.v1 import agent_factory_service_pb2_grpc as rpc
from agentloop.v1 import agent_pb2
from server.agent import Agent
from server.errors import InvalidArgument
from server.factory import AgentFactory
from server.status import mapped
from server.validation import page_offset

Context = grpc.aio.ServicerContext[Any, Any]


def agent_message(agent: Agent) -> agent_pb2.Agent:
    """The `Agent` resource of a live agent."""
    return agent_pb2.Agent(
        agent_id=agent.agent_id,
        session_id=agent.session.session_id,
        status=agent.status,
        options=agent.options,
        create_time=agent.create_time,
    )


def page_bounds(page_size: int, page_token: str, default: int, maximum: int) -> tuple[int, int]:
    """Validated (offset, size) of a page; tokens are decimal offsets."""
    if page_size > maximum:
        raise InvalidArgument("page_size", f"must be at most {maximum}")
    if page_size < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return page_offset(page_token), page_size or default


class AgentFactoryServicer(rpc.AgentFactoryServiceServicer):
    """Creates, resumes, inspects and disposes agents."""

    def __init__(self, factory: AgentFactory) -> None:
        self.factory = factory

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
        )
        return pb.CreateAgentResponse(agent=agent_message(agent))

    @mapped
    async def ResumeAgent(
        self, request: pb.ResumeAgentRequest, context: Context
    ) -> pb.ResumeAgentResponse:
        """Create an agent over an existing session."""
        options = request.options if request.HasField("options") else None
        agent = await self.factory.resume(request.agent_id, request.session_id, options)
        return pb.ResumeAgentResponse(agent=agent_message(agent))

    @mapped
    async def DisposeAgent(
        self, request: pb.DisposeAgentRequest, context: Context
    ) -> pb.DisposeAgentResponse:
        """Dispose an agent."""
        agent = await self.factory.dispose(request.agent_id)
        return pb.DisposeAgentResponse(agent=agent_message(agent))

    @mapped
    async def GetAgent(self, request: pb.GetAgentRequest, context: Context) -> pb.GetAgentResponse:
        """Describe one live agent."""
        return pb.GetAgentResponse(agent=agent_message(self.factory.get(request.agent_id)))

    @mapped
    async def ListAgents(
        self, request: pb.ListAgentsRequest, context: Context
    ) -> pb.ListAgentsResponse:
        """List live agents by id, a page at a time."""
        offset, size = page_bounds(request.page_size, request.page_token, 100, 1000)
        agents = self.factory.list_agents()
        page = agents[offset : offset + size]
        next_token = str(offset + size) if offset + size < len(agents) else ""
        return pb.ListAgentsResponse(
            agents=[agent_message(a) for a in page], next_page_token=next_token
        )
