"""agentloop.plugin: the plugin contract and the helpers that make a plugin a few lines.

- `agentloop.plugin.v1`: the generated contract (`HookService`, `PluginRegistryService`).
- `agentloop.plugin.sdk`: `Plugin` (decorate seam handlers and tools, then `run` or
  `serve`) and the decision constructors (`block_prompt`, `deny`, `accept`, ...).
- `agentloop.plugin.decisions`: those constructors and content helpers, on their own.
- `agentloop.plugin.service`: the gRPC side of a plugin (`Describe`, the `Handle` stream).
"""
