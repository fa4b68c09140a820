"""The asynchronous facade: one verb per RPC, typed keyword arguments, typed errors.

    client = connect("agents.example:50051", token=token, ca_file="ca.pem")
    await client.create("a", provider="scripted", tools=["word_count"])
    turn = await client.send("a", "hi")
    async for event in turn:  # the turn that answers this message, to its turn_end
        print(event)
    view = await turn.view()  # its text, tool calls with results, usage and end
    await client.close()

Every verb raises an `agentloop.errors.AgentloopError` subclass (`NotFound`,
`InvalidArgument`, ...) with the server's `ErrorInfo` and `BadRequest` decoded. The raw
stubs (`factory`, `agents`, `registry`) stay available for anything else.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Unpack

import grpc

from agentloop.connection import MAX_RECEIVE_BYTES, BearerToken, open_channel
from agentloop.conversation import Conversation
from agentloop.errors import call, error_from
from agentloop.options import OptionFields, agent_options
from agentloop.plugin.v1 import hook_service_pb2 as hook
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.plugin.v1 import plugin_registry_service_pb2_grpc
from agentloop.reads import SessionReads
from agentloop.stream import SessionStream
from agentloop.turns import Turn
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import (
    agent_factory_service_pb2_grpc,
    agent_pb2,
    agent_service_pb2_grpc,
    approval_pb2,
)
from agentloop.v1 import agent_service_pb2 as api

if TYPE_CHECKING:
    from agentloop.plugin.v1.plugin_registry_service_pb2_grpc import (
        PluginRegistryServiceAsyncStub,
    )
    from agentloop.v1.agent_factory_service_pb2_grpc import AgentFactoryServiceAsyncStub
    from agentloop.v1.agent_service_pb2_grpc import AgentServiceAsyncStub

__all__ = ["MAX_RECEIVE_BYTES", "BearerToken", "Client", "connect"]


@dataclass
class Client(SessionReads):
    """A channel to a server and its service stubs (made once: a stub is not free)."""

    channel: grpc.aio.Channel
    timeout: float | None = field(default=None, kw_only=True)
    """The deadline of each unary call the verbs make, in seconds (None: no deadline)."""

    @cached_property
    def factory(self) -> AgentFactoryServiceAsyncStub:
        """Create, resume, list and dispose agents."""
        return agent_factory_service_pb2_grpc.AgentFactoryServiceStub(self.channel)

    @cached_property
    def agents(self) -> AgentServiceAsyncStub:
        """Talk to agents and read their sessions."""
        return agent_service_pb2_grpc.AgentServiceStub(self.channel)

    @cached_property
    def registry(self) -> PluginRegistryServiceAsyncStub:
        """Register and list plugins."""
        return plugin_registry_service_pb2_grpc.PluginRegistryServiceStub(self.channel)

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()

    # Agents (AgentFactoryService).

    async def create(
        self,
        agent_id: str,
        options: agent_pb2.AgentOptions | None = None,
        *,
        session_id: str = "",
        cwd: str = "",
        **fields: Unpack[OptionFields],
    ) -> agent_pb2.Agent:
        """Create an agent on a new session (`session_id`: its id, else a new one).

        The agent's options are `options` with each field given as a keyword set on top
        (`provider=`, `model=`, `tools=`, ...: `OptionFields`); the server's defaults
        for the rest.
        """
        request = fac.CreateAgentRequest(
            agent_id=agent_id,
            session_id=session_id,
            options=agent_options(options, **fields),
            metadata=agent_pb2.SessionMetadata(cwd=cwd),
        )
        return (await call(self.factory.CreateAgent(request, timeout=self.timeout))).agent

    async def resume(
        self,
        agent_id: str,
        session_id: str,
        options: agent_pb2.AgentOptions | None = None,
        **fields: Unpack[OptionFields],
    ) -> agent_pb2.Agent:
        """An agent over a stored session; without options, the session's stored ones.

        Options as for `create`: `options` and the keyword fields on top of it.
        """
        request = fac.ResumeAgentRequest(
            agent_id=agent_id,
            session_id=session_id,
            options=agent_options(options, **fields),
        )
        return (await call(self.factory.ResumeAgent(request, timeout=self.timeout))).agent

    async def delete_session(
        self, session_id: str, *, dispose_agent: bool = False, request_id: str = ""
    ) -> api.DeleteSessionResponse:
        """Delete a stored session for good (its forks stay).

        Refused with FAILED_PRECONDITION while a live agent drives it, unless
        `dispose_agent`: then that agent is disposed first.
        """
        request = api.DeleteSessionRequest(
            session_id=session_id, dispose_agent=dispose_agent, request_id=request_id
        )
        return await call(self.agents.DeleteSession(request, timeout=self.timeout))

    async def dispose(self, agent_id: str) -> agent_pb2.Agent:
        """Dispose an agent; its session stays readable."""
        request = fac.DisposeAgentRequest(agent_id=agent_id)
        return (await call(self.factory.DisposeAgent(request, timeout=self.timeout))).agent

    async def get_agent(self, agent_id: str) -> agent_pb2.Agent:
        """A live agent: its session, status, options and pending approvals."""
        request = fac.GetAgentRequest(agent_id=agent_id)
        return (await call(self.factory.GetAgent(request, timeout=self.timeout))).agent

    async def list_agents(self, parent_agent_id: str = "") -> list[agent_pb2.Agent]:
        """Every live agent (only the children of `parent_agent_id`, when given), all pages."""
        agents: list[agent_pb2.Agent] = []
        token = ""
        while True:
            request = fac.ListAgentsRequest(page_token=token, parent_agent_id=parent_agent_id)
            page = await call(self.factory.ListAgents(request, timeout=self.timeout))
            agents.extend(page.agents)
            if not (token := page.next_page_token):
                return agents

    async def drain(self, replica_id: str = "") -> fac.DrainReplicaResponse:
        """Hand a replica's agents over to the others between turns; it stops then.

        `replica_id` names it ("": the replica this client talks to). Waits until the
        agents are handed over (a turn running ends first), so give it time.
        """
        request = fac.DrainReplicaRequest(replica_id=replica_id)
        return await call(self.factory.DrainReplica(request, timeout=self.timeout))

    async def stream_agent_events(self) -> AsyncGenerator[fac.StreamAgentEventsResponse]:
        """Every agent's live events and turn ends, server-wide, as they happen.

        Nothing is replayed: the first response has `subscribed` set (read
        `list_agents` after it for the state the events apply to). It ends when the
        server stops or the loop leaves it; a failure raises an `AgentloopError`.
        """
        responses = self.factory.StreamAgentEvents(fac.StreamAgentEventsRequest())
        try:
            async for response in responses:
                yield response
        except grpc.aio.AioRpcError as error:
            raise error_from(error) from None
        finally:
            responses.cancel()

    # Messages (AgentService).

    async def send(
        self,
        agent_id: str,
        text: str,
        *,
        request_id: str = "",
        steer: bool = False,
        stream: SessionStream | None = None,
    ) -> Turn:
        """Send a message; the `Turn` that answers it (iterate it, or `await turn.view()`).

        The call carries a request id (a new one unless given), so a retry of it never
        queues the message twice, and the turn is found by it. With `steer`, the message
        steers the running turn (which then answers it; when idle it is an ordinary
        message) and `turn.steering` says which. `stream` is a stream of the agent's
        session to read the turn from (see `conversation`); by default the turn opens
        its own.
        """
        request_id = request_id or str(uuid.uuid4())
        steering = False
        if steer:
            steered = await self.steer(agent_id, text, request_id=request_id)
            next_seq, steering = steered.next_seq, steered.steering
        else:
            request = api.SendMessageRequest(agent_id=agent_id, text=text, request_id=request_id)
            next_seq = (await call(self.agents.SendMessage(request, timeout=self.timeout))).next_seq
        turn = Turn(lambda: self.agents, agent_id, request_id, next_seq, stream=stream)
        turn.steering = steering
        return turn

    async def steer(
        self, agent_id: str, text: str, *, request_id: str = ""
    ) -> api.SteerMessageResponse:
        """Steer the running turn (when idle: a message, answered by the next turn)."""
        request = api.SteerMessageRequest(
            agent_id=agent_id, text=text, request_id=request_id or str(uuid.uuid4())
        )
        return await call(self.agents.SteerMessage(request, timeout=self.timeout))

    async def inject(
        self, agent_id: str, text: str, *, request_id: str = ""
    ) -> api.InjectContextResponse:
        """Add context without running the model."""
        request = api.InjectContextRequest(
            agent_id=agent_id, text=text, request_id=request_id or str(uuid.uuid4())
        )
        return await call(self.agents.InjectContext(request, timeout=self.timeout))

    async def cancel(self, agent_id: str, reason: str = "") -> api.CancelTurnResponse:
        """Cancel the running turn and drop what is queued."""
        request = api.CancelTurnRequest(agent_id=agent_id, reason=reason)
        return await call(self.agents.CancelTurn(request, timeout=self.timeout))

    async def wait_idle(self, agent_id: str, seconds: float | None = 30.0) -> api.WaitIdleResponse:
        """Wait until the agent has nothing running or queued.

        At most `seconds`, server-side (None: the server's default wait). The call's
        deadline is `seconds` plus the client's `timeout`.
        """
        request = api.WaitIdleRequest(agent_id=agent_id)
        if seconds is not None:
            request.timeout.FromNanoseconds(int(seconds * 1e9))
        deadline = None if self.timeout is None else (seconds or 0) + self.timeout
        return await call(self.agents.WaitIdle(request, timeout=deadline))

    def conversation(self, agent_id: str) -> Conversation:
        """Message after message to one agent over one stream of its session.

        `async with client.conversation("a") as chat: turn = await chat.send("hi")`:
        each turn is read from the same stream (a turn read while another one is being
        read opens its own), so a long exchange costs one stream, not one per turn.
        """
        return Conversation(self, agent_id)

    # Approvals (AgentService).

    async def approvals(self, agent_id: str) -> list[approval_pb2.ApprovalRequested]:
        """The agent's tool calls waiting for approval, oldest first."""
        request = api.ListApprovalsRequest(agent_id=agent_id)
        listed = await call(self.agents.ListApprovals(request, timeout=self.timeout))
        return list(listed.approvals)

    async def resolve_approval(
        self,
        agent_id: str,
        approval_id: str,
        *,
        allow: bool,
        reason: str = "",
        request_id: str = "",
        via: str = "",
    ) -> approval_pb2.ApprovalResolved:
        """Allow a waiting tool call once, or reject it (`reason`: what the model sees).

        The call carries a request id (a new one unless given), so a retry returns the
        first answer. `via` says where the person answered (recorded as `api:<via>`).
        An approval answered first by someone else raises `FailedPrecondition` (reason
        APPROVAL_RESOLVED), naming who.
        """
        request = api.ResolveApprovalRequest(
            agent_id=agent_id,
            approval_id=approval_id,
            decision=approval_pb2.APPROVAL_DECISION_ALLOW_ONCE
            if allow
            else approval_pb2.APPROVAL_DECISION_REJECT,
            reason=reason,
            request_id=request_id or str(uuid.uuid4()),
            via=via,
        )
        resolved = await call(self.agents.ResolveApproval(request, timeout=self.timeout))
        return resolved.resolution

    # Plugins (PluginRegistryService).

    async def plugins(self) -> list[reg.Plugin]:
        """The registered plugins, with their state and counters."""
        request = reg.ListPluginsRequest()
        return list((await call(self.registry.ListPlugins(request, timeout=self.timeout))).plugins)

    async def tool_sources(self) -> list[reg.ToolSource]:
        """The configured MCP servers: transport, endpoint, state, last error and tools."""
        request = reg.ListToolSourcesRequest()
        response = await call(self.registry.ListToolSources(request, timeout=self.timeout))
        return list(response.sources)

    async def register_plugin(
        self,
        address: str,
        *,
        order: int | None = None,
        deadline: float | None = None,
        failure_policy: hook.FailurePolicy.ValueType = hook.FAILURE_POLICY_UNSPECIFIED,
    ) -> reg.Plugin:
        """Register the plugin served at `address`; the server connects to it.

        `order` overrides the plugin's own order, `deadline` (seconds) its per-call
        timeout, `failure_policy` what a failed call means.
        """
        request = reg.RegisterPluginRequest(address=address, failure_policy=failure_policy)
        if order is not None:
            request.order = order
        if deadline is not None:
            request.timeout.FromNanoseconds(int(deadline * 1e9))
        return (await call(self.registry.RegisterPlugin(request, timeout=self.timeout))).plugin

    async def unregister_plugin(self, name: str) -> reg.UnregisterPluginResponse:
        """Unregister a plugin by name."""
        request = reg.UnregisterPluginRequest(name=name)
        return await call(self.registry.UnregisterPlugin(request, timeout=self.timeout))

    async def compact(
        self,
        agent_id: str,
        instructions: str = "",
        *,
        keep_recent_tokens: int | None = None,
        request_id: str = "",
    ) -> api.CompactAgentResponse:
        """Summarise the idle agent's older history (CompactAgent); retried safely."""
        request = api.CompactAgentRequest(
            agent_id=agent_id,
            instructions=instructions,
            request_id=request_id or str(uuid.uuid4()),
        )
        if keep_recent_tokens is not None:
            request.keep_recent_tokens = keep_recent_tokens
        return await call(self.agents.CompactAgent(request, timeout=self.timeout))


def connect(
    address: str,
    *,
    token: str = "",
    ca_file: str = "",
    cert_file: str = "",
    key_file: str = "",
    tls: bool | None = None,
    timeout: float | None = None,
) -> Client:
    """A client of the server at `address` (host:port).

    Args:
        address: host:port of the server.
        token: The server's bearer token, sent on every call ("" sends none).
        ca_file: PEM roots that the server's certificate must chain to; implies TLS.
        cert_file: This client's PEM certificate chain (mutual TLS), with `key_file`.
        key_file: The private key of `cert_file`.
        tls: Force TLS on (with the system's roots when no `ca_file`) or off; None means
            TLS exactly when a CA file or a client certificate is given.
        timeout: The deadline of each unary call of the verbs, in seconds (None: none).

    A unary call refused with `AGENT_MOVING` or `STORE_UNAVAILABLE` (a replica between
    owners, a database outage) is made again after the server's delay, with the same
    request id (`agentloop.retrying`).
    """
    channel = open_channel(
        address, token=token, ca_file=ca_file, cert_file=cert_file, key_file=key_file, tls=tls
    )
    return Client(channel, timeout=timeout)
