"""Python SDK of agentloop: the contract, the client facade, typed errors, the turn view.

`agentloop.v1` and `agentloop.plugin.v1` hold the generated contract; `connect` and
`connect_sync` open the facade.

The facade's names are imported on first use, not with the package: the generated
messages (`agentloop.v1`) must not drag in grpc, so that the server's core imports them
without a transport. To a type checker they are ordinary imports, fully typed.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentloop.client import Client, connect
    from agentloop.conversation import Conversation
    from agentloop.errors import (
        AgentloopError,
        AlreadyExists,
        FailedPrecondition,
        FieldViolation,
        InvalidArgument,
        NotFound,
        ResourceExhausted,
        Unauthenticated,
        Unavailable,
    )
    from agentloop.stream import SessionStream
    from agentloop.sync import SyncClient, SyncConversation, SyncStream, SyncTurn, connect_sync
    from agentloop.turns import Turn
    from agentloop.view import TextDeltas, ToolCallView, TurnView

_HOMES = {
    "Client": "client", "connect": "client",
    "Conversation": "conversation",
    "SessionStream": "stream",
    "Turn": "turns",
    "TurnView": "view", "ToolCallView": "view", "TextDeltas": "view",
    "SyncClient": "sync", "SyncConversation": "sync", "SyncStream": "sync",
    "SyncTurn": "sync", "connect_sync": "sync",
    "AgentloopError": "errors", "AlreadyExists": "errors", "FailedPrecondition": "errors",
    "FieldViolation": "errors", "InvalidArgument": "errors", "NotFound": "errors",
    "ResourceExhausted": "errors", "Unauthenticated": "errors", "Unavailable": "errors",
}  # fmt: skip
"""Where each facade name lives (the module is imported when the name is first used)."""

__all__ = [
    "AgentloopError",
    "AlreadyExists",
    "Client",
    "Conversation",
    "FailedPrecondition",
    "FieldViolation",
    "InvalidArgument",
    "NotFound",
    "ResourceExhausted",
    "SessionStream",
    "SyncClient",
    "SyncConversation",
    "SyncStream",
    "SyncTurn",
    "TextDeltas",
    "ToolCallView",
    "Turn",
    "TurnView",
    "Unauthenticated",
    "Unavailable",
    "connect",
    "connect_sync",
]

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """A facade name, imported from its module on first use."""
        if home := _HOMES.get(name):
            return getattr(import_module(f"agentloop.{home}"), name)
        raise AttributeError(f"module 'agentloop' has no attribute {name!r}")
