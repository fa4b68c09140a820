"""Metrics and traces of one server, put together; both off unless configured."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from server.kernel.seams import SeamRegistry
from server.observability.exporters import exporter_name
from server.observability.observe import EventClock, Sink

if TYPE_CHECKING:  # each is imported only when the config turns it on (a few MB each)
    from server.observability.metrics import Metrics
    from server.observability.tracing import Tracing

log = logging.getLogger(__name__)


class TelemetrySettings(Protocol):
    """What telemetry reads of the server's configuration (`Config` has it)."""

    @property
    def metrics_listen(self) -> str: ...  # noqa: D102
    @property
    def trace_exporter(self) -> str: ...  # noqa: D102
    @property
    def otlp_endpoint(self) -> str: ...  # noqa: D102


class Telemetry:
    """What `App` starts and stops: the metrics endpoint, the tracer, the event clock."""

    def __init__(self, config: TelemetrySettings, tracing: Tracing | None = None) -> None:
        """Build what the config turns on; `tracing` replaces the configured tracer (tests)."""
        self.listen = config.metrics_listen
        self.metrics: Metrics | None = None
        if self.listen:
            from server.observability.metrics import Metrics

            self.metrics = Metrics()
        self.tracing = tracing
        if tracing is None and exporter_name(config.trace_exporter) != "none":
            from server.observability.tracing import Tracing

            self.tracing = Tracing.from_config(config.trace_exporter, config.otlp_endpoint)
        self.metrics_port = 0
        self._disposers: list[Callable[[], None]] = []

    def install(
        self,
        seams: SeamRegistry,
        agents: Callable[[], int],
        streams: Callable[[], int],
        queued: Callable[[], int],
        plugins: Callable[[], Mapping[str, Any]],
        seam_names: Mapping[Any, str],
    ) -> None:
        """Listen to the session log and read the server's gauges; nothing when all is off."""
        sinks: list[Sink] = [s for s in (self.metrics, self.tracing) if s is not None]
        if sinks:
            self._disposers.append(EventClock(sinks).install(seams))
        if self.tracing is not None:
            self.tracing.install()
        if self.metrics is not None:
            self.metrics.watch("agentloop_agents", "Agents hosted now.", agents)
            self.metrics.watch("agentloop_open_streams", "StreamSessionEvents calls open.", streams)
            self.metrics.watch(
                "agentloop_messages_queued",
                "Messages and steering accepted by live agents that no turn has taken yet.",
                queued,
            )
            self.metrics.collect_plugins(plugins, seam_names)

    async def start(self) -> None:
        """Open the metrics endpoint, when configured."""
        if self.metrics is not None:
            self.metrics_port = await self.metrics.start(self.listen)
            host = self.listen.rpartition(":")[0]
            log.info("metrics on http://%s:%d/metrics", host, self.metrics_port)

    async def stop(self) -> None:
        """Close the endpoint and flush the traces."""
        for dispose in self._disposers:
            dispose()
        self._disposers.clear()
        if self.metrics is not None:
            await self.metrics.stop()
        if self.tracing is not None:
            self.tracing.shutdown()
