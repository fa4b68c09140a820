"""Generated Python SDK of the agentloop contract (agentloop.v1, agentloop.plugin.v1)."""
