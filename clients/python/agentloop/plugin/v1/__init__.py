"""agentloop.plugin.v1: the plugin contract (generated code; edit proto/ and run make gen)."""
