"""OpenTelemetry traces: a span per RPC, turn, step, model call, tool call, plugin call.

Spans follow the GenAI semantic conventions where they apply: a model call is
`chat <model>` with `gen_ai.operation.name`, `gen_ai.provider.name`,
`gen_ai.request.model`, `gen_ai.response.finish_reasons` and `gen_ai.usage.*`; a tool
call is `execute_tool <name>` with `gen_ai.tool.name` and `gen_ai.tool.call.id`.
A turn's spans form one trace (turn > step > model call, tool calls, plugin calls);
the RPC that queued the message is a separate trace, since the turn runs after it
answered. Each call to a plugin (seam, tool and model calls; not notifications) carries
its span's context in `HookCall.traceparent`, so a plugin's spans join the turn's trace.
A log line about an agent whose turn is traced carries that turn's (or open step's)
`trace_id` and `span_id`.

Spans are cheap (the target: tracing and metrics on cost at most 1.2× a turn with
telemetry off, `python -m bench.telemetry_bench`). Each span is one object, a
`ReadableSpan` made with its attributes when it starts and handed as it is to the span
processor when it ends: nothing is made current (no context is attached: every parent
is explicit), and the sampler decides once per trace root (a turn, an RPC, a plugin
call outside a turn): the spans under a root follow its decision, as the SDK's default
`parentbased_*` samplers do (the default sampler is not even asked: it samples every
root). Processors see `on_end`
only (the batch and simple processors do nothing `on_start`); SDK span limits are not
applied (the attributes are few, and bounded).

Off unless `traceExporter` (or `$OTEL_TRACES_EXPORTER`) names an exporter: then the
SDK's batch processor exports over OTLP/gRPC (`otlpEndpoint` or the `OTEL_EXPORTER_OTLP_*`
variables) or prints to stdout (`console`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, DEFAULT_ON, Decision, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import AttributeValue

from agentloop.v1 import session_event_pb2 as ev
from server.observability import observe
from server.observability.exporters import exporter_name
from server.observability.observe import Model, Sink, Step, TraceCarrier, Turn
from server.version import version

TRACER_NAME = "agentloop"


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


MAX_LINKS = 32
"""The most RPCs a turn's span links to (a turn answering a burst keeps the latest)."""


def parse_traceparent(value: str, state: str = "") -> SpanContext | None:
    """The remote span of a W3C `traceparent` header; None when it is malformed."""
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff":
        return None
    version, trace, span, flags = parts[:4]
    if (
        len(trace) != 32
        or len(span) != 16
        or len(flags) != 2
        or (version == "00" and len(parts) != 4)
    ):
        return None
    try:
        trace_id, span_id, bits = int(trace, 16), int(span, 16), int(flags, 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    trace_state = TraceState.from_header([state]) if state else None
    return SpanContext(trace_id, span_id, True, TraceFlags(bits & 0x01), trace_state)


class OpenSpan(ReadableSpan):
    """A span: made with its attributes, handed as it is to the processor when it ends."""

    sampled = True
    """False for `DROPPED` only."""
    # What ReadableSpan's properties read that is the same for every span of ours.
    _instrumentation_info = None
    _links: Sequence[Link] = ()
    _events: Sequence[Event] = ()
    _status = Status(StatusCode.UNSET)
    _end_time: int | None = None
    _attributes: dict[str, AttributeValue]

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        start_ns: int,
        attributes: dict[str, AttributeValue],
        resource: Resource,
        scope: InstrumentationScope | None,
    ) -> None:
        # Not ReadableSpan.__init__: its keyword arguments and defaults cost more than this.
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._start_time = start_ns
        self._attributes = attributes
        self._resource = resource
        self._instrumentation_scope = scope

    def set(self, key: str, value: AttributeValue) -> None:
        """Set an attribute (before the span ends)."""
        self._attributes[key] = value

    def finish(self, end_ns: int, status: Status, events: Sequence[Event], name: str) -> OpenSpan:
        """The span, ended (`status`, `events` and `name`, when given, replace its own)."""
        self._end_time = end_ns
        self._status = status
        self._events = events
        if name:
            self._name = name
        return self


_UNSET = Status(StatusCode.UNSET)

DROPPED = OpenSpan(
    "", SpanContext(0, 0, False), None, SpanKind.INTERNAL, 0, {}, Resource.get_empty(), None
)
"""The span of a root the sampler dropped, and of everything under it."""
DROPPED.sampled = False


def _always_samples_roots(sampler: Sampler) -> bool:
    """Whether `sampler` records and samples every root span, with nothing added to it.

    Such a sampler (the SDK's default, `parentbased_always_on`, or `always_on`) need not be
    asked: nothing here is ever made the current span, so a root has no parent to follow.
    """
    return sampler is ALWAYS_ON or sampler is DEFAULT_ON


class Tracing(Sink):
    """The tracer of one server and the spans of the turns running now."""

    def __init__(self, processor: SpanProcessor) -> None:
        resource = Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "agentloop"),
             "service.version": version()}
        )  # fmt: skip
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(processor)
        self.processor = processor
        # Read once: the provider's sampler (OTEL_TRACES_SAMPLER), ids and resource.
        self._sampler = self.provider.sampler
        self._sample_every_root = _always_samples_roots(self._sampler)
        self._ids = self.provider.id_generator
        self._resource = self.provider.resource
        self._scope = InstrumentationScope(TRACER_NAME, version())
        random_ids = getattr(self._ids, "is_trace_id_random", lambda: False)()
        self._flags = TraceFlags(TraceFlags.SAMPLED | (0x02 if random_ids else 0))
        self._turns: dict[str, OpenSpan] = {}
        self._steps: dict[str, OpenSpan] = {}
        self._tools: dict[tuple[str, str], OpenSpan] = {}
        self._causes: dict[str, list[Link]] = {}
        """Per agent, the RPCs that queued what its next turn answers (bounded below)."""

    @classmethod
    def from_config(cls, exporter: str, endpoint: str) -> Tracing | None:
        """Tracing with a batch processor, or None when no exporter is configured."""
        built = build_exporter(exporter_name(exporter), endpoint)
        return None if built is None else cls(BatchSpanProcessor(built))

    def install(self) -> None:
        """Trace plugin calls too; stamp the log lines of a traced turn with its ids."""
        observe.plugin_call = self.plugin_call
        for handler in logging.getLogger().handlers:
            handler.addFilter(self.log_ids)

    def shutdown(self) -> None:
        """Flush and stop the exporter."""
        if observe.plugin_call == self.plugin_call:
            observe.plugin_call = None
        for handler in logging.getLogger().handlers:
            handler.removeFilter(self.log_ids)
        self.provider.shutdown()

    def log_ids(self, record: logging.LogRecord) -> bool:
        """Stamp a record about an agent with its open step's (or turn's) trace ids.

        The record's `agent` field names the agent; `trace_id` and `span_id` lead from
        the log line to its trace. Always True: a filter that only adds.
        """
        agent = getattr(record, "agent", None)
        span = self._under_step(agent) if isinstance(agent, str) else None
        if span is not None and span.sampled:
            record.trace_id = format(span.context.trace_id, "032x")
            record.span_id = format(span.context.span_id, "016x")
        return True

    # -- making spans ----------------------------------------------------------------------

    def start(
        self,
        name: str,
        parent: OpenSpan | None,
        kind: SpanKind,
        start_ns: int,
        attributes: dict[str, AttributeValue],
    ) -> OpenSpan:
        """A span under `parent` (None: the root of a new trace, which the sampler decides)."""
        if parent is not None:
            if not parent.sampled:
                return DROPPED
            context = parent.context
            trace_id, _, _, flags, state, _ = context  # its fields, without their properties
            own = SpanContext(trace_id, self._ids.generate_span_id(), False, flags, state)
            return OpenSpan(
                name, own, context, kind, start_ns, attributes, self._resource, self._scope
            )
        trace_id = self._ids.generate_trace_id()
        state = None
        if not self._sample_every_root:
            decided = self._sampler.should_sample(None, trace_id, name, kind, attributes)
            if decided.decision is not Decision.RECORD_AND_SAMPLE:  # dropped, or record-only
                return DROPPED
            if decided.attributes:
                attributes = {**attributes, **decided.attributes}
            state = decided.trace_state
        context = SpanContext(trace_id, self._ids.generate_span_id(), False, self._flags, state)
        return OpenSpan(
            name, context, None, kind, start_ns, attributes, self._resource, self._scope
        )

    def end(
        self,
        span: OpenSpan,
        end_ns: int,
        status: Status = _UNSET,
        events: Sequence[Event] = (),
        name: str = "",
    ) -> None:
        """Hand the finished span to the processor (nothing for a dropped one)."""
        if span.sampled:
            self.processor.on_end(span.finish(end_ns, status, events, name))

    def _under_step(self, agent: str) -> OpenSpan | None:
        return self._steps.get(agent) or self._turns.get(agent)

    # -- RPCs and plugin calls -------------------------------------------------------------

    def rpc(self, method: str, peer: str, caller: SpanContext | None = None) -> OpenSpan:
        """Start the span of one RPC (`rpc.*` conventions); `end_rpc` ends it.

        Under `caller`, the client's span from the call's `traceparent`, when it sent one
        (its sampled flag decides, as a parent-based sampler would).
        """
        full = method.lstrip("/")
        service, _, name = full.rpartition("/")
        attributes: dict[str, AttributeValue] = {
            "rpc.system": "grpc", "rpc.service": service, "rpc.method": name,
            "network.peer.address": peer,
        }  # fmt: skip
        if caller is None:
            return self.start(full, None, SpanKind.SERVER, time.time_ns(), attributes)
        if not caller.trace_flags.sampled:
            return DROPPED
        own = SpanContext(caller.trace_id, self._ids.generate_span_id(), False, self._flags)
        return OpenSpan(
            full, own, caller, SpanKind.SERVER, time.time_ns(), attributes, self._resource,
            self._scope,
        )  # fmt: skip

    def caused(self, agent: str, rpc: OpenSpan) -> None:
        """Link `agent`'s next turn to `rpc`, which queued work for it.

        A message, a steer or injected context; at most `MAX_LINKS` are kept per agent.
        """
        if rpc.sampled:
            causes = self._causes.setdefault(agent, [])
            causes.append(Link(rpc.context))
            del causes[:-MAX_LINKS]

    def forget(self, agent: str, rpc: OpenSpan) -> None:
        """Undo `caused`: the RPC was refused and queued nothing."""
        causes = self._causes.get(agent, [])
        causes[:] = [link for link in causes if link.context is not rpc.context]
        if not causes:
            self._causes.pop(agent, None)

    def end_rpc(self, span: OpenSpan, code: str, number: int) -> None:
        """End an RPC's span with its gRPC status (an error status but for OK and CANCELLED)."""
        if not span.sampled:
            return
        span.set("rpc.grpc.status_code", number)
        failed = code not in ("OK", "CANCELLED")
        self.end(span, time.time_ns(), Status(StatusCode.ERROR, code) if failed else _UNSET)

    @contextlib.contextmanager
    def plugin_call(
        self,
        plugin: str,
        seam: str,
        agent: str,
        turn: int,
        step: int,
        carrier: TraceCarrier | None = None,
    ) -> Iterator[None]:
        """The span of one plugin call, under the agent's step (or turn) when one is open.

        Its context goes to the plugin in `carrier` (the `HookCall`): `traceparent` and
        `tracestate`.
        """
        span = self.start(
            f"plugin {plugin} {seam}", self._under_step(agent), SpanKind.CLIENT, time.time_ns(),
            {"agentloop.plugin": plugin, "agentloop.seam": seam, "agentloop.agent": agent,
             "agentloop.turn": turn, "agentloop.step": step},
        )  # fmt: skip
        if carrier is not None and span.sampled:
            carrier.traceparent, carrier.tracestate = traceparent(span.context)
        try:
            yield
        except Exception as error:  # the call failed (a cancel or a close is no failure)
            failure = f"{type(error).__name__}: {error}"
            exception = Event(
                "exception",
                {"exception.type": type(error).__name__, "exception.message": str(error)},
                time.time_ns(),
            )
            self.end(span, time.time_ns(), Status(StatusCode.ERROR, failure), (exception,))
            raise
        self.end(span, time.time_ns())

    # -- the Sink of observe.EventClock ----------------------------------------------------
    # (Not `model_start` nor `first_chunk`: a model call's span is made when it ends, with
    # all it learnt, its first chunk an event of it.)

    def turn_start(self, turn: Turn) -> None:
        """Open the turn's span: the root of its trace, linked to the RPCs that caused it."""
        span = self.start(
            "agent turn", None, SpanKind.INTERNAL, turn.start_ns,
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": turn.agent,
             "gen_ai.conversation.id": turn.session, "agentloop.turn": turn.turn},
        )  # fmt: skip
        causes = self._causes.pop(turn.agent, None)
        if causes and span.sampled:
            span._links = tuple(causes)
        self._turns[turn.agent] = span

    def turn_end(self, turn: Turn, reason: str, end_ns: int) -> None:
        """Close the turn's span with its end reason."""
        span = self._turns.pop(turn.agent, None)
        if span is None or not span.sampled:
            return
        span.set("agentloop.turn.end_reason", reason)
        failed = reason == "error"
        status = Status(StatusCode.ERROR, "the turn ended in error") if failed else _UNSET
        self.end(span, end_ns, status)

    def step_start(self, turn: Turn, step: Step) -> None:
        """Open the step's span under the turn's."""
        self._steps[turn.agent] = self.start(
            "agent step", self._turns.get(turn.agent), SpanKind.INTERNAL, step.start_ns,
            {"agentloop.turn": step.turn, "agentloop.step": step.step},
        )  # fmt: skip

    def step_end(self, turn: Turn, step: Step, end_ns: int) -> None:
        """Close the step's span."""
        span = self._steps.pop(turn.agent, None)
        if span is not None:
            self.end(span, end_ns)

    def model_end(
        self, turn: Turn, step: Step, model: Model, message: ev.AssistantMessage | None, end_ns: int
    ) -> None:
        """The model call's span, under the step's: model, finish reason, token usage."""
        parent = self._under_step(turn.agent)
        if parent is not None and not parent.sampled:
            return
        name = "chat"
        attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": "chat"}
        if message is not None:
            provenance = message.provenance
            model_name = provenance.model
            name = f"chat {model_name}"
            attributes["gen_ai.provider.name"] = provenance.provider
            attributes["gen_ai.request.model"] = model_name
            attributes["gen_ai.response.model"] = model_name
        if model.finish:
            attributes["gen_ai.response.finish_reasons"] = (model.finish,)
        if model.usage is not None:
            attributes["gen_ai.usage.input_tokens"] = model.usage[0]
            attributes["gen_ai.usage.output_tokens"] = model.usage[1]
        span = self.start(name, parent, SpanKind.CLIENT, model.start_ns, attributes)
        failed = message is None or model.finish == "error"
        first = model.first_chunk_ns
        self.end(
            span,
            end_ns,
            Status(StatusCode.ERROR, "the model call failed") if failed else _UNSET,
            (Event("gen_ai.first_chunk", None, first),) if first else (),
        )

    def tool_start(self, turn: Turn, step: Step, call: ev.ToolCall, start_ns: int) -> None:
        """Open the tool call's span under the step's."""
        self._tools[turn.agent, call.call_id] = self.start(
            f"execute_tool {call.name}", self._under_step(turn.agent), SpanKind.CLIENT, start_ns,
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
             "gen_ai.tool.call.id": call.call_id},
        )  # fmt: skip

    def tool_end(
        self, turn: Turn, step: Step, result: ev.ToolResult, name: str, start_ns: int, end_ns: int
    ) -> None:
        """Close the tool call's span; an error result is an error status."""
        span = self._tools.pop((turn.agent, result.call_id), None)
        if span is None or not span.sampled:
            return
        status = _UNSET
        if result.is_error:
            status = Status(StatusCode.ERROR, result.error.code or "the tool failed")
            if result.error.name:
                span.set("error.type", result.error.name)
        self.end(span, end_ns, status)
