"""The registered plugins: registration (connect, describe, subscribe), listing, removal."""

from __future__ import annotations

import asyncio
import functools
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from agentloop.plugin.transport import MAX_MESSAGE_BYTES
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from server.kernel.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from server.kernel.limits import check_capacity
from server.kernel.tasks import cancel_and_wait
from server.loop.runtime import Runtime
from server.plugins.calls import PluginStats
from server.plugins.conditions import LabelsOf, no_labels
from server.plugins.connection import PluginConnection, PluginUnreachable
from server.plugins.description import (
    Overrides,
    effective,
    effective_tool,
    invalid_description,
    seconds_to_duration,
)
from server.plugins.install import install
from server.plugins.refresh import refresh
from server.plugins.required import Expected, all_ready, guard, release
from server.settings.addresses import Allowlist, parse_address

__all__ = ["Overrides", "PluginRegistry", "RegisteredPlugin", "describe"]

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT = 5.0
READY_TIMEOUT = 5.0
CONFIG_RETRY_SECONDS = 2.0


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
    required: bool = False
    """A required config plugin: readiness waits for it to be READY."""
    overrides: Overrides = field(default_factory=Overrides)
    """The operator's overrides, applied again to each new description."""


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
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        labels_of: LabelsOf = no_labels,
    ) -> None:
        self.runtime = runtime
        self.session_of = session_of
        self.labels_of = labels_of
        """A live agent's labels, for the subscriptions' `agent_labels` conditions."""
        self.token = token
        self.root_certificates = root_certificates
        """PEM roots trusted for `tls://` plugins; None trusts the system's."""
        self.allowlist = allowlist or Allowlist()
        """Where plugins may be reached; checked before anything is sent."""
        self.token_plaintext = token_plaintext
        """Send the plugin token without TLS to a non-loopback plugin (the operator's call)."""
        self.max_message_bytes = max_message_bytes
        """The largest message sent to or accepted from a plugin."""
        self.plugins: dict[str, RegisteredPlugin] = {}
        self.expected: dict[str, Expected] = {}
        """Required config plugins not registered yet, by address."""
        self.on_readiness: Callable[[bool], None] = lambda ready: None
        """Told whether every required plugin is READY, whenever that may have changed."""
        self._retries: set[asyncio.Task[None]] = set()

    async def add_config_plugin(
        self, address: str, overrides: Overrides, *, required: bool, name: str = ""
    ) -> None:
        """Register a config plugin now, or keep trying in the background.

        A required one is guarded first (see `server.plugins.required`), so that no turn
        runs without it, even during its first `Describe`.
        """
        if required:
            expected = Expected(name or address, address)
            guard(self.runtime.seams, expected)
            self.expected[address] = expected
            self._readiness_changed()
        try:
            await self._register_config(address, overrides, required)
        except Exception as error:  # retried in the background; the server serves
            log.error("plugin at %s not registered: %s", address, error)
            self.register_in_background(address, overrides, required)

    async def _register_config(self, address: str, overrides: Overrides, required: bool) -> None:
        expected = self.expected.get(address)
        try:
            await self.register(address, overrides, required=required)
        except Exception as error:
            if expected is not None:
                expected.last_error = str(error)
            raise
        if expected is not None:
            release(self.expected.pop(address))
        self._readiness_changed()

    def ready(self) -> bool:
        """Whether every required plugin is registered and READY."""
        states = [p.connection.state for p in self.plugins.values() if p.required]
        return all_ready(states, len(self.expected))

    def _readiness_changed(self) -> None:
        self.on_readiness(self.ready())

    async def register(
        self, address: str, overrides: Overrides, *, required: bool = False
    ) -> RegisteredPlugin:
        """Connect to a plugin, describe it, subscribe its listeners and tools."""
        self._check_address(address)
        check_capacity(self.runtime.limits, "max_plugins", len(self.plugins), "plugins")
        stats = PluginStats()
        connection = PluginConnection(
            address, self.token, stats, self.root_certificates, self.max_message_bytes
        )
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
                tools, stats, list(description.models), required=required, overrides=overrides,
            )  # fmt: skip
            # All or nothing, and published only once installed: no await from the name
            # check to here, so no other registration can take the name in between.
            plugin.disposers = install(
                plugin.name, subscriptions, tools, connection, stats,
                self.runtime.seams, self.runtime.tools, self.session_of,
                description.models, self.runtime.models, self.runtime.plugin_timeout,
                self.labels_of,
            )  # fmt: skip
        except BaseException:
            # Refused, failed or cancelled (a config plugin's retry at shutdown): nothing
            # of it stays, not even its channel.
            await connection.close()
            raise
        self.plugins[plugin.name] = plugin
        connection.on_state = self._readiness_changed
        connection.on_reconnect = functools.partial(
            refresh, plugin, self.runtime, self.session_of, DESCRIBE_TIMEOUT, self.labels_of
        )
        connection.start()
        if not await connection.wait_ready(READY_TIMEOUT):
            log.warning("plugin %s registered but its stream is not open yet", plugin.name)
        log.info("plugin %s %s registered at %s", plugin.name, plugin.version, address)
        return plugin

    def register_in_background(
        self, address: str, overrides: Overrides, required: bool = False
    ) -> None:
        """Register a config plugin, retrying until it answers (the server keeps serving)."""

        async def keep_trying() -> None:
            while True:
                try:
                    await self._register_config(address, overrides, required)
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
        self._readiness_changed()

    def list_plugins(self) -> list[reg.Plugin]:
        """Every plugin, by name, with state, counters and latencies.

        Required config plugins not registered yet are listed too, CONNECTING.
        """
        listed = {name: describe(plugin) for name, plugin in self.plugins.items()}
        for expected in self.expected.values():
            listed.setdefault(expected.name, expected.listed())
        return [listed[name] for name in sorted(listed)]

    async def close(self) -> None:
        """Stop retrying and close every connection."""
        # Awaited: a cancelled attempt closes its own connection before we go on.
        await cancel_and_wait(self._retries)
        for expected in self.expected.values():
            release(expected)
        for name in list(self.plugins):
            await self.unregister(name)

    def _check_address(self, text: str) -> None:
        """Allowed, and safe for the token: nothing reaches the plugin before this passes."""
        address = parse_address(text, unix_allowed=True)
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


def describe(plugin: RegisteredPlugin) -> reg.Plugin:
    """The `Plugin` resource of a registered plugin."""
    stats = plugin.stats
    latencies = []
    for (kind, seam), samples in sorted(stats.latencies.items()):
        ordered = sorted(samples)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        latencies.append(
            reg.SeamLatency(
                seam=seam,  # type: ignore[arg-type]
                kind=kind,  # type: ignore[arg-type]
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
            oversized_calls=stats.oversized,
            protocol_errors=stats.protocol_errors,
            unexpected_results=stats.unexpected_results,
            skipped_calls=sum(stats.skipped.values()),
        ),
        latencies=latencies,
        last_error=plugin.connection.last_error,
        models=plugin.models,
        required=plugin.required,
    )
