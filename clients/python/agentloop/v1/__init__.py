"""agentloop.v1: the public API (generated code; edit proto/ and run make gen)."""
