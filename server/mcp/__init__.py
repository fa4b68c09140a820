"""MCP servers as tool sources.

The tools of any Model Context Protocol server, offered to the agents that opt in
(`mcp:<server>/<tool>` or a pattern) and called through the whole tool pipeline. `config`
declares a server, `naming` maps names and opt-ins, `source` keeps one connection
(restarted with backoff), `results` maps what a call returns, `sources` starts them all.
"""
