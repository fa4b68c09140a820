"""Generated Python SDK of the agentloop contract (agentloop.v1, agentloop.plugin.v1)."""

from typing import Any

__all__ = [
    "Client", "Conversation", "SessionStream", "SyncClient", "Turn", "connect", "connect_sync",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """The facade's names (`Client`, `connect`, `Turn`, ...), imported on first use.

    Lazily: the generated messages (`agentloop.v1`) must not drag in grpc, so that the
    server's core imports them without a transport.
    """
    if name in ("Client", "connect"):
        from agentloop import client

        return getattr(client, name)
    if name == "Turn":
        from agentloop.turns import Turn

        return Turn
    if name == "Conversation":
        from agentloop.conversation import Conversation

        return Conversation
    if name in ("SyncClient", "connect_sync"):
        from agentloop import sync

        return getattr(sync, name)
    if name == "SessionStream":
        from agentloop.stream import SessionStream

        return SessionStream
    raise AttributeError(f"module 'agentloop' has no attribute {name!r}")
