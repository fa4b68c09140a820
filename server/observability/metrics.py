"""Prometheus metrics on their own HTTP port (`metricsListen`; off by default).

Turns, steps, model calls, tools and approvals are measured off the session log
(`observe`), and so are the gauges of running turns and pending approvals;
`agentloop_build_info` names the versions; the process and Python collectors of
`prometheus_client` add CPU, memory, descriptors and GC.
RPCs by the access interceptor (labelled as Prometheus' gRPC conventions label them);
store commits and model retries through their hooks; plugins are
read at scrape time from the counters `ListPlugins` reports; active agents and open
streams are read at scrape time too. An event-loop lag probe runs while it is on.
The counters and histograms updated per turn, step, tool call and RPC are the cheap
ones of `server.observability.instruments`, read at scrape time.
"""

from __future__ import annotations

import asyncio
import platform
import time
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Gauge,
    start_http_server,
)
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1.approval_pb2 import ApprovalOutcome, ApprovalRequested, ApprovalResolved
from agentloop.v1.content_pb2 import ModelConfig
from server.kernel.tasks import cancel_and_wait
from server.observability import observe
from server.observability.instruments import Instruments
from server.observability.observe import PLUGIN_CALL_BUCKETS, Model, Sink, Step, Turn
from server.version import version

LATENCY = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Histogram buckets in seconds, from a fast tool to a long turn."""
APPROVAL_WAIT = (1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 14400, 86400)
"""Approval waits in seconds: a person answers in seconds to hours."""
OUTCOMES = {
    number: name.removeprefix("APPROVAL_OUTCOME_").lower()
    for name, number in ApprovalOutcome.items()
}
_to_text: Callable[[float], str] = floatToGoString  # untyped upstream
CALL_LES: tuple[str, ...] = (*(_to_text(bound) for bound in PLUGIN_CALL_BUCKETS), "+Inf")
"""The `le` labels of the plugin call histogram."""
MODELS_KEPT = 10_000
"""Agents whose latest model the error counter remembers (to label a failed call)."""
LAG = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
LAG_INTERVAL = 0.25
"""Seconds between two probes of the event loop."""


class Metrics(Sink):
    """Every metric of one server, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # Updated on every turn, step, tool call and RPC: the cheap instruments.
        fast = Instruments()
        self.turns = fast.counter("agentloop_turns", "Turns ended, by end reason.", ["reason"])
        self.turn_seconds = fast.histogram(
            "agentloop_turn_duration_seconds", "Turn latency.", LATENCY
        )
        self.step_seconds = fast.histogram(
            "agentloop_step_duration_seconds", "Step latency.", LATENCY
        )
        self.first_chunk_seconds = fast.histogram(
            "agentloop_model_first_chunk_seconds",
            "From a step's start to the model's first chunk.",
            LATENCY,
        )
        self.model_calls = fast.counter(
            "agentloop_model_calls", "Model calls, by finish reason.", ["finish"]
        )
        self.tokens = fast.counter(
            "agentloop_model_tokens",
            "Tokens the models reported, by provider, model and kind (input, output).",
            ["provider", "model", "kind"],
        )
        self.model_errors = fast.counter(
            "agentloop_model_errors",
            "Model calls that failed (an error finish, or no message), by provider and model.",
            ["provider", "model"],
        )
        self.model_retries = fast.counter(
            "agentloop_model_retries",
            "Model requests sent again after a transient failure, by provider and cause.",
            ["provider", "cause"],
        )
        self.approvals = fast.counter(
            "agentloop_approvals",
            "Approvals resolved, by outcome (allowed_once, rejected, cancelled, expired).",
            ["outcome"],
        )
        self.approval_wait = fast.histogram(
            "agentloop_approval_wait_seconds",
            "From an approval's request to its resolution.",
            APPROVAL_WAIT,
        )
        self.tool_calls = fast.counter(
            "agentloop_tool_calls", "Tool calls, by tool and outcome.", ["tool", "outcome"]
        )
        self.tool_seconds = fast.histogram(
            "agentloop_tool_duration_seconds",
            "From a tool call's start to its recorded result.",
            LATENCY,
            ["tool"],
        )
        self.rpcs = fast.counter(
            "agentloop_rpcs",
            "RPCs handled, by service, method and status code.",
            ["grpc_service", "grpc_method", "grpc_code"],
        )
        self.rpc_seconds = fast.histogram(
            "agentloop_rpc_duration_seconds",
            "RPC latency, by service and method.",
            LATENCY,
            ["grpc_service", "grpc_method"],
        )
        self.store_commit = fast.histogram(
            "agentloop_store_commit_seconds", "Group commit latency of the session store.", LATENCY
        )
        self.registry.register(fast)
        # The process's CPU, memory and descriptors; the interpreter's GC and version.
        for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(standard)
        build = Gauge(
            "agentloop_build_info",
            "Always 1: the running build, by its versions.",
            ["version", "sdk_version", "python_version"],
            registry=self.registry,
        )
        build.labels(*build_versions()).set(1)
        self.loop_lag = PromHistogram(
            "agentloop_event_loop_lag_seconds",
            "How late the event loop ran a timer (probed every 0.25 s).",
            buckets=LAG,
            registry=self.registry,
        )
        self.running_turns: set[str] = set()
        """The agents whose turn is open now."""
        self.waiting: dict[str, tuple[str, int]] = {}
        """Pending approvals: approval id -> its agent, and when it was requested (ns)."""
        self.watch("agentloop_turns_running", "Turns running now.", self._running)
        self.watch("agentloop_approvals_pending", "Approvals waiting now.", self._pending)
        self._models: dict[str, tuple[str, str]] = {}
        """Per agent, the provider and model it calls (its request header, its answers)."""
        self._lag_task: asyncio.Task[None] | None = None
        self._http: WSGIServer | None = None

    def watch(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A gauge read at scrape time."""
        Gauge(name, help_text, registry=self.registry).set_function(read)

    def collect_plugins(
        self, read: Callable[[], Mapping[str, Any]], seam_names: Mapping[Any, str]
    ) -> None:
        """Plugin counters and latencies (by `seam_names`) read at scrape time: name -> stats."""
        self.registry.register(PluginCollector(read, seam_names))

    def rpc(self, method: str, code: str, seconds: float) -> None:
        """One RPC ended (`method` as gRPC names it: /package.Service/Method)."""
        service, _, name = method.lstrip("/").partition("/")
        self.rpcs.inc((service, name, code))
        self.rpc_seconds.observe(seconds, (service, name))

    def _running(self) -> float:
        return len(self.running_turns)

    def _pending(self) -> float:
        return len(self.waiting)

    def _retried(self, provider: str, cause: str) -> None:
        self.model_retries.inc((provider, cause))

    async def start(self, listen: str) -> int:
        """Serve `/metrics` on `listen` (host:port); returns the bound port."""
        host, _, port = listen.rpartition(":")
        server, _thread = start_http_server(int(port), host.strip("[]"), registry=self.registry)
        self._http = server
        observe.store_commit = self.store_commit.observe
        observe.model_retry = self._retried
        self._lag_task = asyncio.get_running_loop().create_task(self._probe_lag())
        return int(server.server_port)

    async def stop(self) -> None:
        """Stop the endpoint and the probe."""
        if observe.store_commit == self.store_commit.observe:
            observe.store_commit = None
        if observe.model_retry == self._retried:
            observe.model_retry = None
        if self._lag_task is not None:
            await cancel_and_wait([self._lag_task])
        if self._http is not None:
            server, self._http = self._http, None
            await asyncio.to_thread(server.shutdown)
            server.server_close()

    async def _probe_lag(self) -> None:
        while True:
            due = time.perf_counter() + LAG_INTERVAL
            await asyncio.sleep(LAG_INTERVAL)
            self.loop_lag.observe(max(0.0, time.perf_counter() - due))

    # -- the Sink of observe.EventClock (nothing to count when a step, model or tool call
    # starts) --------------------------------------------------------------------------

    def turn_start(self, turn: Turn) -> None:
        """One more turn running."""
        self.running_turns.add(turn.agent)

    def turn_end(self, turn: Turn, reason: str, end_ns: int) -> None:
        """Count the turn and its latency."""
        self.running_turns.discard(turn.agent)
        if self.waiting:  # an approval its turn outlived (a crash leaves none resolved)
            for key in [k for k, (agent, _) in self.waiting.items() if agent == turn.agent]:
                del self.waiting[key]
        self.turns.inc((reason,))
        self.turn_seconds.observe(max(0, end_ns - turn.start_ns) / 1e9)

    def step_end(self, turn: Turn, step: Step, end_ns: int) -> None:
        """The step's latency."""
        self.step_seconds.observe(max(0, end_ns - step.start_ns) / 1e9)

    def first_chunk(self, turn: Turn, step: Step, model: Model) -> None:
        """Time to the first chunk."""
        self.first_chunk_seconds.observe(max(0, model.first_chunk_ns - model.start_ns) / 1e9)

    def model_end(
        self, turn: Turn, step: Step, model: Model, message: ev.AssistantMessage | None, end_ns: int
    ) -> None:
        """Count the call by finish reason, its failure, and its tokens."""
        self.model_calls.inc((model.finish or "none",))
        if message is not None:
            provider, name = message.provenance.provider, message.provenance.model
        else:  # failed before its message: the model the agent was calling
            provider, name = self._models.get(turn.agent, ("unknown", "unknown"))
        if message is None or model.finish == "error":
            self.model_errors.inc((provider, name))
        else:
            self._remember(turn.agent, provider, name)
        if model.usage is not None:
            self.tokens.inc((provider, name, "input"), model.usage[0])
            self.tokens.inc((provider, name, "output"), model.usage[1])

    def tool_end(
        self, turn: Turn, step: Step, result: ev.ToolResult, name: str, start_ns: int, end_ns: int
    ) -> None:
        """Count the call and its duration."""
        self.tool_calls.inc((name, "error" if result.is_error else "ok"))
        self.tool_seconds.observe(max(0, end_ns - start_ns) / 1e9, (name,))

    def model_config(self, agent: str, config: ModelConfig) -> None:
        """The provider and model the agent calls now (labels a call that fails early)."""
        self._remember(agent, config.provider, config.model)

    def _remember(self, agent: str, provider: str, model: str) -> None:
        if len(self._models) >= MODELS_KEPT:  # agents come and go: forget them all at times
            self._models.clear()
        self._models[agent] = (provider, model)

    def approval_requested(self, agent: str, requested: ApprovalRequested, now_ns: int) -> None:
        """One more approval waiting."""
        self.waiting[requested.approval_id] = (agent, now_ns)

    def approval_resolved(self, agent: str, resolved: ApprovalResolved, now_ns: int) -> None:
        """Count the outcome and the wait."""
        waited = self.waiting.pop(resolved.approval_id, None)
        outcome = OUTCOMES.get(resolved.outcome, "unknown")
        self.approvals.inc((outcome,))
        if waited is not None:
            self.approval_wait.observe(max(0, now_ns - waited[1]) / 1e9)


def build_versions() -> tuple[str, str, str]:
    """The server's version, the SDK's it runs with, and Python's."""
    try:
        sdk = installed("agentloop-client")
    except PackageNotFoundError:
        sdk = "0+unknown"
    return version(), sdk, platform.python_version()


class PluginCollector(Collector):
    """Per plugin, the counters of its connection; per plugin and seam, its latency."""

    COUNTERS = (
        ("calls", "Calls sent to the plugin."),
        ("errors", "Calls that failed other than by a timeout."),
        ("timeouts", "Calls that timed out."),
        ("fail_opens", "Failed calls skipped under the fail-open policy."),
        ("dropped", "Observer notifications dropped."),
        ("reconnects", "Reconnections of the plugin's stream."),
        ("oversized", "Messages refused for their size."),
        ("protocol_errors", "Answers that broke the plugin protocol."),
        ("unexpected_results", "Results of calls that were not pending."),
    )
    """Read with a default of 0: a counter the plugin client does not keep stays 0."""

    def __init__(
        self, read: Callable[[], Mapping[str, Any]], seam_names: Mapping[Any, str]
    ) -> None:
        self.read = read
        self.seam_names = seam_names

    def collect(self) -> Iterable[Any]:
        """The families, read now."""
        plugins = self.read()
        for attr, help_text in self.COUNTERS:
            family = CounterMetricFamily(f"agentloop_plugin_{attr}", help_text, labels=["plugin"])
            for name, stats in plugins.items():
                family.add_metric([name], getattr(stats, attr, 0))
            yield family
        latency = HistogramMetricFamily(
            "agentloop_plugin_call_seconds",
            "Latency of answered plugin calls, by plugin and seam.",
            labels=["plugin", "seam"],
        )
        for name, stats in plugins.items():
            by_seam: dict[str, list[float]] = {}
            for key, counts in getattr(stats, "histograms", {}).items():
                seam = key[-1] if isinstance(key, tuple) else key  # keyed by (kind, seam)
                seam_name = self.seam_names.get(seam, str(seam))
                merged = by_seam.setdefault(seam_name, [0.0] * len(counts))
                for index, count in enumerate(list(counts)):
                    merged[index] += count
            for seam_name, counts in by_seam.items():
                cumulative, buckets = 0.0, []
                for le, count in zip(CALL_LES, counts, strict=False):
                    cumulative += count
                    buckets.append((le, cumulative))
                latency.add_metric([name, seam_name], buckets, counts[-1])
        yield latency
        skipped = CounterMetricFamily(
            "agentloop_plugin_calls_skipped",
            "Calls not made because the subscription's match conditions did not match.",
            labels=["plugin", "seam"],
        )
        for name, stats in plugins.items():
            for seam, count in sorted(getattr(stats, "skipped", {}).items()):
                skipped.add_metric([name, self.seam_names.get(seam, str(seam))], count)
        yield skipped
        up = GaugeMetricFamily("agentloop_plugins", "Registered plugins.")
        up.add_metric([], len(plugins))
        yield up
