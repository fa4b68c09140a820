"""agentloop.plugin: the plugin contract and the helpers that make a plugin a few lines."""
