"""Installing a plugin: its subscriptions, tools and models registered, all or nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.kernel.seams import SeamRegistry
from server.kernel.tools import ToolRegistry
from server.models import ModelRegistry
from server.plugins import codecs
from server.plugins.calls import DEFAULT_TIMEOUT, PluginCaller, PluginStats
from server.plugins.conditions import LabelsOf, no_labels
from server.plugins.listeners import RemoteListener
from server.plugins.model import PluginModel
from server.plugins.tools import remote_tool


def install(
    plugin: str,
    subscriptions: list[hk.Subscription],
    tools: list[hk.ToolDefinition],
    caller: PluginCaller,
    stats: PluginStats,
    seams: SeamRegistry,
    registry: ToolRegistry,
    session_of: Callable[[str], str],
    models: Sequence[hk.ModelProviderDefinition] = (),
    model_registry: ModelRegistry | None = None,
    default_timeout: float = DEFAULT_TIMEOUT,
    labels_of: LabelsOf = no_labels,
) -> list[Callable[[], None]]:
    """Register a plugin's listeners, tools and models; returns their disposers.

    All or nothing: when one registration fails, those already made are undone and the
    error propagates.
    """
    disposers: list[Callable[[], None]] = []
    try:
        for subscription in subscriptions:
            timeout = (
                subscription.timeout.ToNanoseconds() / 1e9
                if subscription.HasField("timeout")
                else default_timeout
            )
            remote = RemoteListener(
                plugin, subscription, caller, stats, session_of, timeout, labels_of=labels_of
            )
            disposers.append(codecs.register(remote, seams))
        for definition in tools:
            timeout = (
                definition.timeout.ToNanoseconds() / 1e9
                if definition.HasField("timeout")
                else default_timeout
            )
            tool = remote_tool(plugin, definition, caller, stats, session_of, timeout)
            disposers.append(registry.register(tool))
        if model_registry is not None:
            for model in models:
                served = PluginModel(plugin, model, caller, stats)
                disposers.append(
                    model_registry.register(
                        model.provider, served, default_model=model.default_model
                    )
                )
    except BaseException:
        for dispose in reversed(disposers):
            dispose()
        raise
    return disposers
