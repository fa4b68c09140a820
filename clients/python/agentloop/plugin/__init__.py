"""agentloop.plugin: the plugin contract and the helpers that make a plugin a few lines.

- `agentloop.plugin.v1`: the generated contract (`HookService`, `PluginRegistryService`).
- `agentloop.plugin.sdk`: `Plugin` (decorate seam handlers, tools and model providers,
  then `run` or `serve`), the decision constructors (`block_prompt`, `deny`, `accept`,
  ...) and the chunk helpers (`text_chunks`, `finish_chunk`, ...).
- `agentloop.plugin.decisions`: those constructors and content helpers, on their own.
- `agentloop.plugin.models`: the chunk helpers, and the streaming of one model call.
- `agentloop.plugin.service`: the gRPC side of a plugin (`Describe`, the `Handle` stream).
"""
