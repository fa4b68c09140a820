"""Polled endpoints for the connections a plugin accepts (`agentloop.plugin.polling`).

The plugin's serving side imports this before grpc.
"""

from agentloop.plugin.polling import LISTENER, prefer_polled_endpoints

POLLED = prefer_polled_endpoints(LISTENER)
"""Whether this process's gRPC uses polled endpoints for accepted connections."""
