"""agentloop server: the agent loop core and its gRPC edges."""

from agentloop.plugin.polling import CLIENT, prefer_polled_endpoints

# Before anything loads grpc: the channels to plugins use gRPC's polled endpoints (less
# CPU per message; see agentloop.plugin.polling). The server's own listener is unchanged.
prefer_polled_endpoints(CLIENT)
