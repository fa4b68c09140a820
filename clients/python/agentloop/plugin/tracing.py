"""A plugin continues the server's trace: each call's handler runs in a child span.

While the server traces, each call it sends (seam, tool and model calls) carries the
W3C trace context of its span of the call in `HookCall.traceparent` (and
`tracestate`). When OpenTelemetry is importable in the plugin process, the handler
runs inside a span `handle <payload>` (kind SERVER) whose parent is the server's span,
made current, so the spans the handler makes join the trace too. They are exported by
the tracer provider the plugin process configured; with none configured, nothing is
recorded and the server's context is still current. OpenTelemetry is optional
(`pip install 'agentloop-client[otel]'`): without it, calls run as they are.
`call.traceparent` is on every call either way.

```python
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)  # before plugin.run(...)
```
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from agentloop.plugin.v1 import hook_service_pb2 as hs

try:  # optional: the helper works without it
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: Any = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised in a process without OpenTelemetry
    _PROPAGATOR = None

TRACER_NAME = "agentloop.plugin"


def available() -> bool:
    """Whether OpenTelemetry is importable here (so calls are traced)."""
    return _PROPAGATOR is not None


async def traced(plugin: str, call: hs.HookCall, work: Awaitable[None]) -> None:
    """Await `work` (the running of `call`) in a child span of the server's span of it.

    Without a `traceparent` on the call, or without OpenTelemetry, it just awaits it.
    """
    if _PROPAGATOR is None or not call.traceparent:
        await work
        return
    carrier = {"traceparent": call.traceparent}
    if call.tracestate:
        carrier["tracestate"] = call.tracestate
    parent = _PROPAGATOR.extract(carrier)
    payload = call.WhichOneof("payload") or "call"
    with _trace.get_tracer(TRACER_NAME).start_as_current_span(
        f"handle {payload}",
        context=parent,
        kind=_trace.SpanKind.SERVER,
        attributes={
            "agentloop.plugin": plugin,
            "agentloop.call_id": call.call_id,
            "agentloop.agent": call.agent_id,
            "agentloop.turn": call.turn,
            "agentloop.step": call.step,
        },
    ):
        await work
