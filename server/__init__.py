"""agentloop server: the agent loop core and its gRPC edges."""
