"""agentloop: the command-line client of the agentloop gRPC service (`agentloop --help`).

It ships with the SDK (`agentloop-client`) and uses its facade, `agentloop.Client`;
it needs no server code.
"""

from agentloop.cli.main import main

__all__ = ["main"]
