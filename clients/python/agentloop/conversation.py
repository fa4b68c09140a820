"""Message after message to one agent, every turn read from one stream of its session."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from agentloop.stream import SessionStream
from agentloop.turns import Turn

if TYPE_CHECKING:
    from agentloop.client import Client


class Conversation:
    """One agent's session, followed on one stream by the turns of successive sends.

    The stream opens with the first turn read (from that send's `next_seq`) and stays
    open; a later turn skips what it does not need. Close it (or use `async with`) when
    done: a stream by agent id follows the agent until it is disposed.
    """

    def __init__(self, client: Client, agent_id: str) -> None:
        self.client = client
        self.agent_id = agent_id
        self.stream = SessionStream(lambda: client.agents, agent_id=agent_id)

    async def send(self, text: str, *, request_id: str = "", steer: bool = False) -> Turn:
        """`Client.send` to this agent; the turn reads the shared stream."""
        return await self.client.send(
            self.agent_id, text, request_id=request_id, steer=steer, stream=self.stream
        )

    def close(self) -> None:
        """End the stream."""
        self.stream.close()

    async def __aenter__(self) -> Conversation:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
