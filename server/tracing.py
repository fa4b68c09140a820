"""OpenTelemetry traces: a span per RPC, turn, step, model call, tool call, plugin call.

Spans follow the GenAI semantic conventions where they apply: a model call is
`chat <model>` with `gen_ai.operation.name`, `gen_ai.provider.name`,
`gen_ai.request.model`, `gen_ai.response.finish_reasons` and `gen_ai.usage.*`; a tool
call is `execute_tool <name>` with `gen_ai.tool.name` and `gen_ai.tool.call.id`.
A turn's spans form one trace (turn > step > model call, tool calls, plugin calls);
the RPC that queued the message is a separate trace, since the turn runs after it
answered. Each call to a plugin (seam, tool and model calls; not notifications) carries
its span's context in `HookCall.traceparent`, so a plugin's spans join the turn's trace.

Off unless `traceExporter` (or `$OTEL_TRACES_EXPORTER`) names an exporter: then the
SDK's batch processor exports over OTLP/gRPC (`otlpEndpoint` or the `OTEL_EXPORTER_OTLP_*`
variables) or prints to stdout (`console`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode

from agentloop.v1 import session_event_pb2 as ev
from server import observe
from server.observe import Model, Step, TraceCarrier, Turn
from server.version import version

TRACER_NAME = "agentloop"


def exporter_name(configured: str) -> str:
    """The exporter in force: the config's, else `$OTEL_TRACES_EXPORTER`, else none."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return "none"
    return configured or os.environ.get("OTEL_TRACES_EXPORTER", "none").split(",")[0].strip()


def traceparent(context: SpanContext) -> tuple[str, str]:
    """The W3C `traceparent` and `tracestate` of a span context."""
    state = context.trace_state.to_header() if context.trace_state else ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}", state


def build_exporter(name: str, endpoint: str) -> SpanExporter | None:
    """The exporter called `name`; None for "none"."""
    if name == "console":
        return ConsoleSpanExporter()
    if name == "otlp":
        # Imported here: the OTLP exporter pulls in its own gRPC stubs.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    if name in ("none", ""):
        return None
    raise ValueError(f"unknown trace exporter {name!r} (known: otlp, console, none)")


class Tracing:
    """The tracer of one server and the spans of the turns running now."""

    def __init__(self, processor: SpanProcessor) -> None:
        resource = Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "agentloop"),
             "service.version": version()}
        )  # fmt: skip
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer(TRACER_NAME, version())
        self._turns: dict[str, Span] = {}
        self._steps: dict[str, Span] = {}
        self._models: dict[str, Span] = {}
        self._tools: dict[tuple[str, str], Span] = {}

    @classmethod
    def from_config(cls, exporter: str, endpoint: str) -> Tracing | None:
        """Tracing with a batch processor, or None when no exporter is configured."""
        built = build_exporter(exporter_name(exporter), endpoint)
        return None if built is None else cls(BatchSpanProcessor(built))

    def install(self) -> None:
        """Trace plugin calls too."""
        observe.plugin_call = self.plugin_call

    def shutdown(self) -> None:
        """Flush and stop the exporter."""
        if observe.plugin_call == self.plugin_call:
            observe.plugin_call = None
        self.provider.shutdown()

    @contextlib.contextmanager
    def rpc(self, method: str, peer: str) -> Iterator[Span]:
        """The span of one RPC (`rpc.*` conventions); the caller sets its status."""
        service, _, name = method.lstrip("/").rpartition("/")
        with self.tracer.start_as_current_span(
            method.lstrip("/"),
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": service,
                "rpc.method": name,
                "network.peer.address": peer,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    @contextlib.contextmanager
    def plugin_call(
        self, plugin: str, seam: str, agent: str, turn: int, step: int,
        carrier: TraceCarrier | None = None,
    ) -> Iterator[None]:
        """The span of one plugin call, under the agent's step (or turn) when one is open.

        Its context goes to the plugin in `carrier` (the `HookCall`): `traceparent` and
        `tracestate`. Nothing runs under it in this process, so it is never made current.
        """
        parent = self._steps.get(agent) or self._turns.get(agent)
        span = self.tracer.start_span(
            f"plugin {plugin} {seam}",
            context=trace.set_span_in_context(parent) if parent is not None else None,
            kind=SpanKind.CLIENT,
            attributes={"agentloop.plugin": plugin, "agentloop.seam": seam,
                        "agentloop.agent": agent, "agentloop.turn": turn, "agentloop.step": step},
        )  # fmt: skip
        if carrier is not None:
            carrier.traceparent, carrier.tracestate = traceparent(span.get_span_context())
        try:
            yield
        except Exception as error:  # the call failed (a cancel or a close is no failure)
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            raise
        finally:
            span.end()

    # -- the Sink of observe.EventClock ----------------------------------------------------

    def turn_start(self, turn: Turn) -> None:
        """Open the turn's span: the root of its trace."""
        self._turns[turn.agent] = self.tracer.start_span(
            "agent turn",
            context=trace.set_span_in_context(trace.INVALID_SPAN),  # a new trace
            start_time=turn.start_ns,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.id": turn.agent,
                "gen_ai.conversation.id": turn.session,
                "agentloop.turn": turn.turn,
            },
        )

    def turn_end(self, turn: Turn, reason: str, end_ns: int) -> None:
        """Close the turn's span with its end reason."""
        span = self._turns.pop(turn.agent, None)
        if span is None:
            return
        span.set_attribute("agentloop.turn.end_reason", reason)
        if reason == "error":
            span.set_status(Status(StatusCode.ERROR, "the turn ended in error"))
        span.end(end_time=end_ns)

    def step_start(self, turn: Turn, step: Step) -> None:
        """Open the step's span under the turn's."""
        parent = self._turns.get(turn.agent)
        self._steps[turn.agent] = self.tracer.start_span(
            "agent step",
            context=trace.set_span_in_context(parent) if parent is not None else None,
            start_time=step.start_ns,
            attributes={"agentloop.turn": step.turn, "agentloop.step": step.step},
        )

    def step_end(self, turn: Turn, step: Step, end_ns: int) -> None:
        """Close the step's span."""
        span = self._steps.pop(turn.agent, None)
        if span is not None:
            span.end(end_time=end_ns)

    def model_start(self, turn: Turn, step: Step, model: Model) -> None:
        """Open the model call's span under the step's."""
        self._models[turn.agent] = self._child(
            turn.agent, "chat", model.start_ns, {"gen_ai.operation.name": "chat"}
        )

    def first_chunk(self, turn: Turn, step: Step, model: Model) -> None:
        """Mark the first chunk on the model call's span."""
        span = self._models.get(turn.agent)
        if span is not None:
            span.add_event("gen_ai.first_chunk", timestamp=model.first_chunk_ns)

    def model_end(
        self, turn: Turn, step: Step, model: Model, message: ev.AssistantMessage | None, end_ns: int
    ) -> None:
        """Close the model call's span with the model, finish reason and token usage."""
        span = self._models.pop(turn.agent, None)
        if span is None:
            return
        attributes: dict[str, Any] = {}
        if message is not None:
            provenance = message.provenance
            span.update_name(f"chat {provenance.model}")
            attributes["gen_ai.provider.name"] = provenance.provider
            attributes["gen_ai.request.model"] = provenance.model
            attributes["gen_ai.response.model"] = provenance.model
        if model.finish:
            attributes["gen_ai.response.finish_reasons"] = (model.finish,)
        usage = observe.usage_of(message)
        if usage is not None:
            attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
            attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        span.set_attributes(attributes)
        if message is None or model.finish == "error":
            span.set_status(Status(StatusCode.ERROR, "the model call failed"))
        span.end(end_time=end_ns)

    def tool_start(self, turn: Turn, step: Step, call: ev.ToolCall, start_ns: int) -> None:
        """Open the tool call's span under the step's."""
        self._tools[turn.agent, call.call_id] = self._child(
            turn.agent,
            f"execute_tool {call.name}",
            start_ns,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.call_id,
            },
        )

    def tool_end(
        self, turn: Turn, step: Step, result: ev.ToolResult, name: str, start_ns: int, end_ns: int
    ) -> None:
        """Close the tool call's span; an error result is an error status."""
        span = self._tools.pop((turn.agent, result.call_id), None)
        if span is None:
            return
        if result.is_error:
            span.set_status(Status(StatusCode.ERROR, result.error.code or "the tool failed"))
            if result.error.name:
                span.set_attribute("error.type", result.error.name)
        span.end(end_time=end_ns)

    def _child(self, agent: str, name: str, start_ns: int, attributes: dict[str, Any]) -> Span:
        parent = self._steps.get(agent) or self._turns.get(agent)
        return self.tracer.start_span(
            name,
            context=trace.set_span_in_context(parent) if parent is not None else None,
            start_time=start_ns,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
