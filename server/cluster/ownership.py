"""Who owns a live agent: this process alone, or one replica of many.

The factory asks before it publishes an agent and tells when it disposes one. A
single server owns every agent it creates (`Solo`); replicas over a shared store take
leases instead (`server.cluster.leases.Cluster`), so that each live agent runs in exactly one
of them.
"""

from __future__ import annotations

from typing import Protocol

from agentloop.v1 import agent_pb2


class Ownership(Protocol):
    """The factory's view of agent ownership."""

    async def acquire(
        self, agent_id: str, session_id: str, options: agent_pb2.AgentOptions
    ) -> None:
        """Own a new live agent; raises `AlreadyExists` or `FailedPrecondition` if taken."""
        ...

    async def confirm(
        self, agent_id: str, session_id: str, options: agent_pb2.AgentOptions
    ) -> None:
        """Still own the agent as it goes live (its session stored); raises if it went."""
        ...

    async def release(self, agent_id: str) -> None:
        """The agent was disposed: nobody owns it any more."""
        ...

    async def still_driven(self, session_id: str) -> bool:
        """Whether an agent still drives the session somewhere (its events still come)."""
        ...


class Solo:
    """One server: every agent it creates is its own."""

    async def acquire(
        self, agent_id: str, session_id: str, options: agent_pb2.AgentOptions
    ) -> None:
        """Nothing to take: the factory's own registry is the arbiter."""

    async def confirm(
        self, agent_id: str, session_id: str, options: agent_pb2.AgentOptions
    ) -> None:
        """Nothing can take it meanwhile."""

    async def release(self, agent_id: str) -> None:
        """Nothing to give back."""

    async def still_driven(self, session_id: str) -> bool:
        """No other server: the factory's own sessions are all there is."""
        return False
