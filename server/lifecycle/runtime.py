"""The runtime of a server, built from its configuration: store, tools, models.

Each part a configuration does not name is not imported: the OpenAI-compatible provider
(httpx) only for configured providers, the PostgreSQL store (asyncpg) only for replicas.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from server.loop.builtin_tools import builtin_tools
from server.loop.runtime import Runtime
from server.models.scripted import ScriptedModel
from server.settings.config import Config
from server.stores import SessionStore
from server.stores.memory import MemoryStore
from server.stores.sqlite import SqliteStore

if TYPE_CHECKING:
    from server.stores.postgres import PostgresStore

log = logging.getLogger(__name__)


def build_store(config: Config) -> SessionStore:
    """The session store the config asks for."""
    if config.store == "memory":
        return MemoryStore()
    if config.store == "postgres":
        return postgres(config)
    return SqliteStore(Path(config.data_dir) / "agentloop.db", config.durability)


def postgres(config: Config) -> PostgresStore:
    """The PostgreSQL store of a replica.

    Imported only by a server that uses it: asyncpg and the replica's parts are dozens
    of modules a default (SQLite) server never loads.
    """
    from server.stores.postgres import PostgresStore

    return PostgresStore(config.postgres_dsn, lease_seconds=config.lease_seconds)


def build_runtime(config: Config) -> Runtime:
    """The runtime of a server: its store, the built-in tools and the scripted model."""
    runtime = Runtime(
        store=build_store(config),
        max_parallel_tool_calls=config.max_parallel_tool_calls,
        default_provider=config.default_provider,
        plugin_timeout=config.plugin_timeout_seconds,
        approval_timeout=config.approval_timeout_seconds,
        tool_order=list(config.tool_order) if config.tool_order is not None else None,
        limits=config.limits,
        context_windows={
            p.name: p.context_window_tokens for p in config.providers if p.context_window_tokens
        },
        output_reserve=config.output_reserve_tokens,
        keep_recent=config.keep_recent_tokens,
    )
    for tool in builtin_tools():
        runtime.tools.register(tool)
    runtime.models.register("scripted", ScriptedModel(), default_model="echo")
    for provider in config.providers:
        # Imported only when a provider needs it: httpx (with the CLI it pulls in when
        # click and rich are installed) is ~100 modules a default server never uses.
        from server.models.openai import OpenAIModel

        if provider.api_key_env and not os.environ.get(provider.api_key_env):
            log.warning("provider %s: $%s is not set; no API key will be sent",
                        provider.name, provider.api_key_env)  # fmt: skip
        api_key = os.environ.get(provider.api_key_env, "") if provider.api_key_env else ""
        model = OpenAIModel.configured(provider, api_key)
        runtime.models.register(provider.name, model, default_model=provider.default_model)
    return runtime
