"""Describe again on every reconnect: a restarted plugin is served as it now describes itself.

Before the stream is reopened the server calls `Describe` again. A changed version,
subscriptions, tools or models replace the old ones (overrides applied again), all at
once, and `ListPlugins` shows them. A plugin that now gives another name, or an invalid
description, stays down with that reason, and is retried with backoff; its old
listeners stay, so its FAIL_CLOSED seams keep failing closed meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.loop.runtime import Runtime
from server.plugins.conditions import LabelsOf, no_labels
from server.plugins.connection import PluginUnreachable
from server.plugins.description import effective, effective_tool, invalid_description
from server.plugins.install import install

if TYPE_CHECKING:
    from collections.abc import Callable

    from server.plugins.registry import RegisteredPlugin


async def refresh(
    plugin: RegisteredPlugin,
    runtime: Runtime,
    session_of: Callable[[str], str],
    describe_timeout: float,
    labels_of: LabelsOf = no_labels,
) -> None:
    """Describe `plugin` again and apply what changed; raises `PluginUnreachable`."""
    description = await plugin.connection.describe(describe_timeout)
    if description.name != plugin.name:
        raise PluginUnreachable(f'it now names itself "{description.name}", not "{plugin.name}"')
    own_tools = {tool.name for tool in plugin.tools}
    own_providers = {model.provider for model in plugin.models}
    problem = invalid_description(
        description,
        runtime.tools.names() - own_tools,
        set(runtime.models.names()) - own_providers,
    )
    if problem:
        raise PluginUnreachable(f"it describes itself invalidly: {problem}")
    subscriptions = [effective(s, plugin.overrides) for s in description.subscriptions]
    tools = [effective_tool(t, plugin.overrides) for t in description.tools]
    models = list(description.models)
    plugin.version = description.version
    if (subscriptions, tools, models) == (plugin.subscriptions, plugin.tools, plugin.models):
        return
    for dispose in plugin.disposers:
        dispose()
    plugin.disposers = install(
        plugin.name, subscriptions, tools, plugin.connection, plugin.stats,
        runtime.seams, runtime.tools, session_of, models, runtime.models,
        runtime.plugin_timeout, labels_of,
    )  # fmt: skip
    plugin.subscriptions, plugin.tools, plugin.models = subscriptions, tools, models
