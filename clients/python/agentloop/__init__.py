"""Generated Python SDK of the agentloop contract (agentloop.v1, agentloop.plugin.v1)."""

from typing import Any

__all__ = ["Client", "Turn", "connect"]


def __getattr__(name: str) -> Any:
    """`agentloop.Client`, `connect` and `Turn`, imported on first use.

    Lazily: the generated messages (`agentloop.v1`) must not drag in grpc, so that the
    server's core imports them without a transport.
    """
    if name in ("Client", "connect"):
        from agentloop import client

        return getattr(client, name)
    if name == "Turn":
        from agentloop.turns import Turn

        return Turn
    raise AttributeError(f"module 'agentloop' has no attribute {name!r}")
