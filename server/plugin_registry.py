"""The registered plugins: registration (connect, describe, subscribe), listing, removal."""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf import duration_pb2

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import session_event_pb2 as ev
from server.addresses import Allowlist, parse_address
from server.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from server.factory import ID_PATTERN
from server.jsonvalue import check_lossless
from server.limits import check_capacity
from server.plugin_client import PluginConnection, PluginUnreachable
from server.plugin_listeners import SEAM_NAMES, PluginStats, install, tool_schema
from server.runtime import Runtime

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT = 5.0
READY_TIMEOUT = 5.0
CONFIG_RETRY_SECONDS = 2.0


@dataclass(frozen=True)
class Overrides:
    """Operator overrides applied on top of a plugin's own description."""

    order: int | None = None
    timeout: float | None = None
    failure_policy: hk.FailurePolicy.ValueType = hk.FAILURE_POLICY_UNSPECIFIED


@dataclass
class RegisteredPlugin:
    """One plugin as the server holds it."""

    name: str
    version: str
    address: str
    connection: PluginConnection
    subscriptions: list[hk.Subscription]
    tools: list[hk.ToolDefinition]
    stats: PluginStats
    models: list[hk.ModelProviderDefinition] = field(default_factory=list)
    disposers: list[Callable[[], None]] = field(default_factory=list)


class PluginRegistry:
    """Plugins by name."""

    def __init__(
        self,
        runtime: Runtime,
        session_of: Callable[[str], str],
        token: str,
        root_certificates: bytes | None = None,
        allowlist: Allowlist | None = None,
        token_plaintext: bool = False,
    ) -> None:
        self.runtime = runtime
        self.session_of = session_of
        self.token = token
        self.root_certificates = root_certificates
        """PEM roots trusted for `tls://` plugins; None trusts the system's."""
        self.allowlist = allowlist or Allowlist()
        """Where plugins may be reached; checked before anything is sent."""
        self.token_plaintext = token_plaintext
        """Send the plugin token without TLS to a non-loopback plugin (the operator's call)."""
        self.plugins: dict[str, RegisteredPlugin] = {}
        self._retries: set[asyncio.Task[None]] = set()

    async def register(self, address: str, overrides: Overrides) -> RegisteredPlugin:
        """Connect to a plugin, describe it, subscribe its listeners and tools."""
        self._check_address(address)
        check_capacity(self.runtime.limits, "max_plugins", len(self.plugins), "plugins")
        stats = PluginStats()
        connection = PluginConnection(address, self.token, stats, self.root_certificates)
        try:
            try:
                description = await connection.describe(DESCRIBE_TIMEOUT)
            except PluginUnreachable as error:
                raise FailedPrecondition(
                    f"cannot describe the plugin at {address}: {error}"
                ) from None
            self._check(address, description)
            subscriptions = [effective(s, overrides) for s in description.subscriptions]
            tools = [effective_tool(t, overrides) for t in description.tools]
            plugin = RegisteredPlugin(
                description.name, description.version, address, connection, subscriptions,
                tools, stats, list(description.models),
            )  # fmt: skip
            # All or nothing, and published only once installed: no await from the name
            # check to here, so no other registration can take the name in between.
            plugin.disposers = install(
                plugin.name, subscriptions, tools, connection, stats,
                self.runtime.seams, self.runtime.tools, self.session_of,
                description.models, self.runtime.models, self.runtime.plugin_timeout,
            )  # fmt: skip
        except BaseException:
            # Refused, failed or cancelled (a config plugin's retry at shutdown): nothing
            # of it stays, not even its channel.
            await connection.close()
            raise
        self.plugins[plugin.name] = plugin
        connection.start()
        if not await connection.wait_ready(READY_TIMEOUT):
            log.warning("plugin %s registered but its stream is not open yet", plugin.name)
        log.info("plugin %s %s registered at %s", plugin.name, plugin.version, address)
        return plugin

    def register_in_background(self, address: str, overrides: Overrides) -> None:
        """Register a config plugin, retrying until it answers (the server keeps serving)."""

        async def keep_trying() -> None:
            while True:
                try:
                    await self.register(address, overrides)
                    return
                except Exception as error:  # logged; the next attempt may succeed
                    log.error("plugin at %s not registered yet: %s", address, error)
                await asyncio.sleep(CONFIG_RETRY_SECONDS)

        task = asyncio.create_task(keep_trying())
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def unregister(self, name: str) -> None:
        """Remove a plugin's listeners and tools and close its connection."""
        plugin = self.plugins.pop(name, None)
        if plugin is None:
            raise NotFound(f'plugin "{name}" is not registered')
        for dispose in plugin.disposers:
            dispose()
        await plugin.connection.close()

    def list_plugins(self) -> list[reg.Plugin]:
        """Every registered plugin, by name, with state, counters and latencies."""
        return [describe(self.plugins[name]) for name in sorted(self.plugins)]

    async def close(self) -> None:
        """Stop retrying and close every connection."""
        retries = list(self._retries)
        for task in retries:
            task.cancel()
        # Awaited: a cancelled attempt closes its own connection before we go on.
        await asyncio.gather(*retries, return_exceptions=True)
        for name in list(self.plugins):
            await self.unregister(name)

    def _check_address(self, text: str) -> None:
        """Allowed, and safe for the token: nothing reaches the plugin before this passes."""
        address = parse_address(text)
        self.allowlist.check(address, text)
        if self.token and not address.tls and not address.loopback and not self.token_plaintext:
            raise InvalidArgument(
                "address",
                f"{text!r} is not loopback: the plugin token goes only over tls:// there"
                " (or set pluginTokenPlaintext)",
            )

    def _check(self, address: str, description: hk.DescribeResponse) -> None:
        if description.name in self.plugins:
            raise AlreadyExists(f'a plugin named "{description.name}" is already registered')
        problem = invalid_description(
            description, self.runtime.tools.names(), set(self.runtime.models.names())
        )
        if problem:
            raise FailedPrecondition(
                f"the plugin at {address} describes itself invalidly: {problem}"
            )


def invalid_description(
    description: hk.DescribeResponse, taken_tools: set[str], taken_providers: set[str]
) -> str:
    """What is wrong with a plugin's description; empty when nothing is."""
    if not ID_PATTERN.fullmatch(description.name):
        return f"name {description.name!r} must be 1-128 letters, digits, '.', '_', ':', '-'"
    kinds = {f.name for f in ev.SessionEvent.DESCRIPTOR.oneofs_by_name["payload"].fields}
    for subscription in description.subscriptions:
        unknown = sorted(set(subscription.event_kinds) - kinds)
        if unknown:
            return f"unknown session event kinds {unknown} (known: {sorted(kinds)})"
        seam = seam_name(subscription.seam)
        if subscription.seam not in SEAM_NAMES:
            return f"a subscription names seam {seam}, which cannot be subscribed to"
        if subscription.failure_policy not in hk.FailurePolicy.values():
            return f"the subscription to {seam} has an unknown failure policy"
        if subscription.HasField("timeout") and subscription.timeout.ToNanoseconds() <= 0:
            return f"the subscription to {seam} has a timeout of zero or less"
    names = [tool.name for tool in description.tools]
    for name in names:
        if not name or names.count(name) > 1:
            return f"tool name {name!r} is empty or repeated"
        if name in taken_tools:
            return f'tool "{name}" is already provided'
    for tool in description.tools:
        if tool.HasField("timeout") and tool.timeout.ToNanoseconds() <= 0:
            return f'tool "{tool.name}" has a timeout of zero or less'
        try:
            check_lossless(tool_schema(tool), "its input schema")
        except (ValueError, TypeError) as error:
            return f'tool "{tool.name}": its input schema is not valid JSON ({error})'
    for model in description.models:
        if not ID_PATTERN.fullmatch(model.provider):
            return f"model provider name {model.provider!r} is not valid"
        if model.provider in taken_providers:
            return f'model provider "{model.provider}" is already served'
        if model.HasField("timeout") and model.timeout.ToNanoseconds() <= 0:
            return f'model provider "{model.provider}" has a timeout of zero or less'
    return ""


def seam_name(seam: int) -> str:
    """The contract name of a seam number, or the number itself when it is unknown."""
    try:
        return hk.Seam.Name(seam)  # type: ignore[arg-type]
    except ValueError:
        return str(seam)


def effective(subscription: hk.Subscription, overrides: Overrides) -> hk.Subscription:
    """A subscription with the operator's overrides applied."""
    result = hk.Subscription()
    result.CopyFrom(subscription)
    if overrides.order is not None:
        result.order = overrides.order
    if overrides.timeout is not None:
        result.timeout.CopyFrom(seconds_to_duration(overrides.timeout))
    if overrides.failure_policy:
        result.failure_policy = overrides.failure_policy
    if not result.failure_policy:
        result.failure_policy = hk.FAILURE_POLICY_FAIL_CLOSED
    return result


def effective_tool(tool: hk.ToolDefinition, overrides: Overrides) -> hk.ToolDefinition:
    """A tool definition with the operator's timeout applied."""
    result = hk.ToolDefinition()
    result.CopyFrom(tool)
    if overrides.timeout is not None:
        result.timeout.CopyFrom(seconds_to_duration(overrides.timeout))
    return result


def seconds_to_duration(seconds: float) -> duration_pb2.Duration:
    """A Duration of `seconds`."""
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(int(seconds * 1e9))
    return duration


def describe(plugin: RegisteredPlugin) -> reg.Plugin:
    """The `Plugin` resource of a registered plugin."""
    stats = plugin.stats
    latencies = []
    for seam, samples in sorted(stats.latencies.items()):
        ordered = sorted(samples)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        latencies.append(
            reg.SeamLatency(
                seam=seam,  # type: ignore[arg-type]
                calls=len(ordered),
                p50=seconds_to_duration(statistics.median(ordered)),
                p99=seconds_to_duration(p99),
            )
        )
    return reg.Plugin(
        name=plugin.name,
        version=plugin.version,
        address=plugin.address,
        state=plugin.connection.state,
        subscriptions=plugin.subscriptions,
        tools=plugin.tools,
        stats=reg.PluginStats(
            calls=stats.calls,
            errors=stats.errors,
            timeouts=stats.timeouts,
            fail_opens=stats.fail_opens,
            dropped_notifications=stats.dropped,
            reconnects=stats.reconnects,
        ),
        latencies=latencies,
        last_error=plugin.connection.last_error,
        models=plugin.models,
    )
