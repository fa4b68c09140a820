"""Connect to an agentloop server, over plaintext or TLS, with a token or a client cert.

Plaintext is for loopback; elsewhere TLS with a CA file, optionally with a client
certificate (mutual TLS), and the server's bearer token. The verbs cover the common
calls; the raw stubs (`factory`, `agents`, `registry`) everything else:

    client = connect("agents.example:50051", token=token, ca_file="ca.pem")
    await client.create("a")
    turn = await client.send("a", "hi")
    async for event in turn:  # the turn that answers this message, to its turn_end
        print(event)
    await client.close()
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from agentloop.conversation import Conversation
from agentloop.plugin.v1 import hook_service_pb2 as hook
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.plugin.v1 import plugin_registry_service_pb2_grpc
from agentloop.stream import SessionStream
from agentloop.turns import Turn
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import (
    agent_factory_service_pb2_grpc,
    agent_pb2,
    agent_service_pb2_grpc,
    approval_pb2,
    session_pb2,
)
from agentloop.v1 import agent_service_pb2 as api

if TYPE_CHECKING:
    from agentloop.plugin.v1.plugin_registry_service_pb2_grpc import (
        PluginRegistryServiceAsyncStub,
    )
    from agentloop.v1.agent_factory_service_pb2_grpc import AgentFactoryServiceAsyncStub
    from agentloop.v1.agent_service_pb2_grpc import AgentServiceAsyncStub

MAX_RECEIVE_BYTES = 4 * 1024 * 1024
"""gRPC's default receive limit; the server bounds every event well under it."""


@dataclass
class Client:
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

    async def create(
        self,
        agent_id: str,
        options: agent_pb2.AgentOptions | None = None,
        *,
        session_id: str = "",
        cwd: str = "",
    ) -> agent_pb2.Agent:
        """Create an agent on a new session."""
        request = fac.CreateAgentRequest(
            agent_id=agent_id,
            session_id=session_id,
            options=options,
            metadata=agent_pb2.SessionMetadata(cwd=cwd),
        )
        return (await self.factory.CreateAgent(request, timeout=self.timeout)).agent

    async def resume(
        self, agent_id: str, session_id: str, options: agent_pb2.AgentOptions | None = None
    ) -> agent_pb2.Agent:
        """An agent over a stored session; without options, the session's stored ones."""
        request = fac.ResumeAgentRequest(agent_id=agent_id, session_id=session_id, options=options)
        return (await self.factory.ResumeAgent(request, timeout=self.timeout)).agent

    async def fork(
        self, session_id: str, boundary_seq: int | None = None, new_session_id: str = ""
    ) -> session_pb2.Session:
        """A new stored session with `session_id`'s events up to a `turn_end`."""
        request = api.ForkSessionRequest(
            session_id=session_id, boundary_seq=boundary_seq, new_session_id=new_session_id
        )
        return (await self.agents.ForkSession(request, timeout=self.timeout)).session

    async def dispose(self, agent_id: str) -> agent_pb2.Agent:
        """Dispose an agent; its session stays readable."""
        request = fac.DisposeAgentRequest(agent_id=agent_id)
        return (await self.factory.DisposeAgent(request, timeout=self.timeout)).agent

    async def send(
        self,
        agent_id: str,
        text: str,
        *,
        request_id: str = "",
        steer: bool = False,
        stream: SessionStream | None = None,
    ) -> Turn:
        """Send a message; the `Turn` that answers it (iterate it for its events).

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
            steered = await self.agents.SteerMessage(
                api.SteerMessageRequest(agent_id=agent_id, text=text, request_id=request_id),
                timeout=self.timeout,
            )
            next_seq, steering = steered.next_seq, steered.steering
        else:
            sent = await self.agents.SendMessage(
                api.SendMessageRequest(agent_id=agent_id, text=text, request_id=request_id),
                timeout=self.timeout,
            )
            next_seq = sent.next_seq
        turn = Turn(lambda: self.agents, agent_id, request_id, next_seq, stream=stream)
        turn.steering = steering
        return turn

    def conversation(self, agent_id: str) -> Conversation:
        """Message after message to one agent over one stream of its session.

        `async with client.conversation("a") as chat: turn = await chat.send("hi")`:
        each turn is read from the same stream (a turn read while another one is being
        read opens its own), so a long exchange costs one stream, not one per turn.
        """
        return Conversation(self, agent_id)

    def stream(
        self,
        *,
        agent_id: str = "",
        session_id: str = "",
        from_seq: int = 0,
        replay_only: bool = False,
    ) -> SessionStream:
        """A session's events from `from_seq`, reconnecting after a failure.

        By `agent_id` (the live agent's session, with its live agent events) or by
        `session_id`; `replay_only` ends it at the end of the stored log.
        """
        return SessionStream(
            lambda: self.agents,
            agent_id=agent_id,
            session_id=session_id,
            from_seq=from_seq,
            replay_only=replay_only,
        )

    async def list_agents(self) -> list[agent_pb2.Agent]:
        """Every live agent, following the pages."""
        agents: list[agent_pb2.Agent] = []
        token = ""
        while True:
            page = await self.factory.ListAgents(
                fac.ListAgentsRequest(page_token=token), timeout=self.timeout
            )
            agents.extend(page.agents)
            if not (token := page.next_page_token):
                return agents

    async def list_sessions(self) -> list[session_pb2.Session]:
        """Every stored session, following the pages."""
        sessions: list[session_pb2.Session] = []
        token = ""
        while True:
            page = await self.agents.ListSessions(
                api.ListSessionsRequest(page_token=token), timeout=self.timeout
            )
            sessions.extend(page.sessions)
            if not (token := page.next_page_token):
                return sessions

    async def plugins(self) -> list[reg.Plugin]:
        """The registered plugins, with their state and counters."""
        listed = await self.registry.ListPlugins(reg.ListPluginsRequest(), timeout=self.timeout)
        return list(listed.plugins)

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
        return (await self.registry.RegisterPlugin(request, timeout=self.timeout)).plugin

    async def unregister_plugin(self, name: str) -> reg.UnregisterPluginResponse:
        """Unregister a plugin by name."""
        return await self.registry.UnregisterPlugin(
            reg.UnregisterPluginRequest(name=name), timeout=self.timeout
        )

    async def steer(
        self, agent_id: str, text: str, *, request_id: str = ""
    ) -> api.SteerMessageResponse:
        """Steer the running turn (when idle: a message, answered by the next turn)."""
        request = api.SteerMessageRequest(
            agent_id=agent_id, text=text, request_id=request_id or str(uuid.uuid4())
        )
        return await self.agents.SteerMessage(request, timeout=self.timeout)

    async def inject(
        self, agent_id: str, text: str, *, request_id: str = ""
    ) -> api.InjectContextResponse:
        """Add context without running the model."""
        request = api.InjectContextRequest(
            agent_id=agent_id, text=text, request_id=request_id or str(uuid.uuid4())
        )
        return await self.agents.InjectContext(request, timeout=self.timeout)

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
        return await self.agents.CompactAgent(request, timeout=self.timeout)

    async def cancel(self, agent_id: str, reason: str = "") -> api.CancelTurnResponse:
        """Cancel the running turn and drop what is queued."""
        return await self.agents.CancelTurn(
            api.CancelTurnRequest(agent_id=agent_id, reason=reason), timeout=self.timeout
        )

    async def approvals(self, agent_id: str) -> list[approval_pb2.ApprovalRequested]:
        """The agent's tool calls waiting for approval, oldest first."""
        listed = await self.agents.ListApprovals(
            api.ListApprovalsRequest(agent_id=agent_id), timeout=self.timeout
        )
        return list(listed.approvals)

    async def resolve_approval(
        self,
        agent_id: str,
        approval_id: str,
        *,
        allow: bool,
        reason: str = "",
        request_id: str = "",
    ) -> approval_pb2.ApprovalResolved:
        """Allow a waiting tool call once, or reject it (`reason`: what the model sees).

        The call carries a request id (a new one unless given), so a retry returns the
        first answer. An approval answered first by someone else raises
        FAILED_PRECONDITION (reason APPROVAL_RESOLVED), naming who.
        """
        request = api.ResolveApprovalRequest(
            agent_id=agent_id,
            approval_id=approval_id,
            decision=approval_pb2.APPROVAL_DECISION_ALLOW_ONCE
            if allow
            else approval_pb2.APPROVAL_DECISION_REJECT,
            reason=reason,
            request_id=request_id or str(uuid.uuid4()),
        )
        resolved = await self.agents.ResolveApproval(request, timeout=self.timeout)
        return resolved.resolution

    async def wait_idle(self, agent_id: str, seconds: float | None = 30.0) -> api.WaitIdleResponse:
        """Wait until the agent has nothing running or queued.

        At most `seconds`, server-side (None: the server's default wait). The call's
        deadline is `seconds` plus the client's `timeout`.
        """
        request = api.WaitIdleRequest(agent_id=agent_id)
        if seconds is not None:
            request.timeout.FromNanoseconds(int(seconds * 1e9))
        deadline = None if self.timeout is None else (seconds or 0) + self.timeout
        return await self.agents.WaitIdle(request, timeout=deadline)


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
    """
    options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
    use_tls = tls if tls is not None else bool(ca_file or cert_file)
    if not use_tls:
        interceptors = [BearerToken(token)] if token else None
        channel = grpc.aio.insecure_channel(address, options, interceptors=interceptors)
        return Client(channel, timeout=timeout)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file),
        private_key=_read(key_file),
        certificate_chain=_read(cert_file),
    )
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return Client(grpc.aio.secure_channel(address, credentials, options), timeout=timeout)


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


class BearerToken(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call of a plaintext channel.

    gRPC's own token credentials refuse plaintext; plaintext is meant for loopback only.
    """

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._metadata)
        return details._replace(metadata=metadata)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        """A unary call with the token."""
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        """A streaming call with the token."""
        return await continuation(self._details(details), request)
