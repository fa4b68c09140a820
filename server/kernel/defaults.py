"""The defaults the configuration shares with the runtime built without one (tests, benches).

Every other default is written once, on its field in `server/settings/config.py`.
"""

from __future__ import annotations

PLUGIN_TIMEOUT_SECONDS = 5.0
"""The deadline of a plugin call whose subscription (and operator override) sets none."""
MAX_PARALLEL_TOOL_CALLS = 10
"""The default parallel tool-call cap of every agent."""
DEFAULT_PROVIDER = "scripted"
"""The built-in provider, and the provider of agents that name none."""
