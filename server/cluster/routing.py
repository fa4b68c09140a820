"""Where a call for an agent is answered: here, at its owner, or "moving, retry soon".

A replica answers a call for an agent itself when it runs the agent (and its leases
are renewed in time); otherwise the agent's lease decides:
- no lease: no live agent has the id; the call is answered here (`NOT_FOUND`, or
  `AGENT_DISPOSED` for an agent disposed here);
- a live lease of another replica: the call goes there (unless it was forwarded
  already: then the owner changed on the way);
- anything else (the lease expired and nobody took it yet, it is this replica's but
  the agent is still being resumed or created here, or this replica's renewal is
  late): the agent is between owners, and the call is refused with `AGENT_MOVING`, a
  retryable `UNAVAILABLE` whose delay is the time a takeover takes. Never `NOT_FOUND`
  or `AGENT_DISPOSED`: the agent lives, and a retry reaches it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from server.kernel.errors import Unavailable
from server.stores.postgres_leases import Location


class AgentMoving(Unavailable):
    """The agent is between two owners: retry after `retry_seconds`."""

    reason = "AGENT_MOVING"

    def __init__(self, agent_id: str, retry_seconds: float) -> None:
        super().__init__(
            f'agent "{agent_id}" is moving to another replica; retry shortly', agent_id=agent_id
        )
        self.retry_seconds = retry_seconds


def takeover_seconds(lease_seconds: float) -> float:
    """The retry delay of a call for an agent between owners: the time a takeover takes.

    A takeover comes within half a lease of the expiry (the sweep's period).
    """
    return max(lease_seconds / 2, 0.1)


Locate = Callable[[str], Awaitable[Location | None]]


class Router:
    """Decides, for one replica, where each call for an agent it does not serve goes."""

    def __init__(self, replica_id: str, locate: Locate, lease_seconds: float) -> None:
        self.replica_id = replica_id
        self.locate = locate
        self.retry_seconds = takeover_seconds(lease_seconds)

    async def owner_address(self, agent_id: str, forwarded: bool) -> str | None:
        """The owner's address to forward to; None to answer here; `AgentMoving` otherwise."""
        where = await self.locate(agent_id)
        if where is None:
            return None
        if where.live and where.owner != self.replica_id and where.address and not forwarded:
            return where.address
        raise AgentMoving(agent_id, self.retry_seconds)

    def moving(self, agent_id: str) -> AgentMoving:
        """The refusal for a call whose owner did not answer (it died, or is cut off)."""
        return AgentMoving(agent_id, self.retry_seconds)
