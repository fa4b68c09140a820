r"""A test plugin that exports its spans to a file: the trace crossing into a plugin.

    python tests/plugins/traced.py --listen 127.0.0.1:0 --spans-file PATH [--no-otel]

Configures the OpenTelemetry SDK in this process (a span processor writing one JSON
line per finished span to PATH: name, trace id, span id, parent span id), then serves a
plugin "traced" whose `agent/prompt-submit` handler makes a span of its own ("tag
prompt") and tags the prompt (`TEXT-traced`), and whose tool `traced_echo` echoes its
`text`, and whose model provider `traced-model` answers "modelled". Each call's
`traceparent`, as the handler saw it, is appended to PATH too
(`{"call": PAYLOAD, "traceparent": ...}`).

`--no-otel` makes OpenTelemetry unimportable (before the helper is imported): the
helper must serve as well without it; the handler then writes `{"otel": false}` once.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


def append(path: str, record: dict[str, Any]) -> None:
    """Append one JSON line to `path` (small, local: blocking is fine here)."""
    with open(path, "a") as file:
        file.write(json.dumps(record) + "\n")


def export_to(path: str) -> None:
    """Install a tracer provider whose finished spans are appended to `path`."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class FileExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for span in spans:
                parent = span.parent
                append(path, {
                    "name": span.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "span_id": f"{span.context.span_id:016x}",
                    "parent_span_id": f"{parent.span_id:016x}" if parent else "",
                    "remote_parent": bool(parent and parent.is_remote),
                })  # fmt: skip
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)


def main() -> None:
    """Parse the command line and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--spans-file", required=True)
    parser.add_argument("--no-otel", action="store_true")
    args = parser.parse_args()
    path: str = args.spans_file
    if args.no_otel:
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import fails
    else:
        export_to(path)

    from agentloop.plugin import tracing
    from agentloop.plugin.sdk import Plugin, allow_prompt, text_of
    from agentloop.plugin.v1 import hook_service_pb2 as hs
    from agentloop.v1 import decision_pb2

    plugin = Plugin("traced", version="test")

    @plugin.prompt_submit()
    async def tag(call: hs.HookCall) -> decision_pb2.PromptDecision:
        append(path, {"call": "prompt_submit", "traceparent": call.traceparent,
                      "otel": tracing.available()})  # fmt: skip
        if tracing.available():
            from opentelemetry import trace

            with trace.get_tracer("traced-test").start_as_current_span("tag prompt"):
                pass
        return allow_prompt(f"{text_of(call.prompt_submit.content)}-traced")

    @plugin.tool("traced_echo", description="Echoes its text.", parallel_safe=True)
    async def echo(arguments: Any, call: hs.HookCall) -> str:
        append(path, {"call": "tool_execute", "traceparent": call.traceparent})
        return str(arguments.get("text", ""))

    @plugin.model("traced-model", default_model="v1")
    async def model(call: hs.HookCall) -> str:
        append(path, {"call": "model_stream", "traceparent": call.traceparent})
        return "modelled"

    plugin.run(args.listen)


if __name__ == "__main__":
    main()
