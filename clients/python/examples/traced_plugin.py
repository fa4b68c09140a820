r"""An example plugin that continues the server's traces, printing its spans.

The server sends each call's trace context in `HookCall.traceparent` while it traces;
with OpenTelemetry configured here, the helper runs each handler in a child span of
the server's span of the call, and the handler's own spans join the trace too. This
one prints its spans to stdout (the console exporter); use an OTLP exporter to send
them to the same collector as the server's.

    OTEL_TRACES_EXPORTER=console .venv/bin/python -m server > server-spans.txt &
    .venv/bin/python clients/python/examples/traced_plugin.py --listen 127.0.0.1:50101 &
    until .venv/bin/agentloop agents > /dev/null 2>&1; do sleep 0.2; done
    .venv/bin/agentloop plugins register 127.0.0.1:50101
    .venv/bin/agentloop send assistant "hello"
"""

from __future__ import annotations

import argparse

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from agentloop.plugin.sdk import Plugin, text_of
from agentloop.plugin.v1 import hook_service_pb2 as hs


def build() -> Plugin:
    """The plugin: a prompt-submit observer that makes a span of its own."""
    plugin = Plugin("traced-example", version="1.0")
    tracer = trace.get_tracer("traced-example")

    @plugin.prompt_submit()
    async def measure(call: hs.HookCall) -> None:
        # call.traceparent is the server's span of this call ("" when it does not trace).
        with tracer.start_as_current_span("measure prompt") as span:
            span.set_attribute("prompt.characters", len(text_of(call.prompt_submit.content)))
        return None  # continue unchanged

    return plugin


def main() -> None:
    """Configure OpenTelemetry (before serving), then serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:50101")
    args = parser.parse_args()
    provider = TracerProvider(resource=Resource.create({"service.name": "traced-example"}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    build().run(args.listen)


if __name__ == "__main__":
    main()
