"""The sampler decides once per trace root; the spans under a dropped root are dropped,
and so is the trace context a plugin call would carry."""

from __future__ import annotations

import time

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import session_event_pb2 as ev
from server.observability.observe import Model, Step, Turn
from server.observability.tracing import Tracing


def one_turn(tracing: Tracing, call: hs.HookCall) -> None:
    """A turn of one step with a model call, a tool call and a plugin call, as the
    event clock reports them."""
    turn = Turn("a1", "s1", 1, time.time_ns())
    tracing.turn_start(turn)
    step = Step(1, 1, time.time_ns())
    model = Model(step.start_ns, first_chunk_ns=time.time_ns(), finish="stop")
    tracing.step_start(turn, step)
    tracing.model_start(turn, step, model)
    with tracing.plugin_call("p", "agent/pre-step", "a1", 1, 1, call):
        pass
    tracing.model_end(turn, step, model, ev.AssistantMessage(), time.time_ns())
    tool = ev.ToolCall(call_id="c1", name="word_count")
    tracing.tool_start(turn, step, tool, time.time_ns())
    tracing.tool_end(turn, step, ev.ToolResult(call_id="c1"), "word_count", 0, time.time_ns())
    tracing.step_end(turn, step, time.time_ns())
    tracing.turn_end(turn, "completed", time.time_ns())


@pytest.mark.parametrize(("sampler", "spans"), [("always_on", 5), ("always_off", 0)])
def test_the_turn_root_decides_for_its_spans(
    monkeypatch: pytest.MonkeyPatch, sampler: str, spans: int
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)  # read by the provider
    exporter = InMemorySpanExporter()
    tracing = Tracing(SimpleSpanProcessor(exporter))
    call = hs.HookCall(call_id="c1")
    one_turn(tracing, call)
    tracing.shutdown()
    finished = exporter.get_finished_spans()
    assert len(finished) == spans
    if spans:
        [root] = [s for s in finished if s.parent is None]
        assert root.name == "agent turn"
        assert {s.context.trace_id for s in finished} == {root.context.trace_id}
        [plugin] = [s for s in finished if s.name == "plugin p agent/pre-step"]
        assert call.traceparent == (
            f"00-{plugin.context.trace_id:032x}-{plugin.context.span_id:016x}-"
            f"{plugin.context.trace_flags:02x}"
        )
        # The OTLP exporter encodes them: resource, scope, ids, parent, attributes, events.
        request = encode_spans(finished)
        [scope_spans] = request.resource_spans[0].scope_spans
        assert scope_spans.scope.name == "agentloop"
        encoded = {span.name: span for span in scope_spans.spans}
        assert encoded["agent step"].parent_span_id == root.context.span_id.to_bytes(8, "big")
        assert encoded["execute_tool word_count"].attributes[0].key == "gen_ai.operation.name"
        assert [e.name for s in finished if s.name.startswith("chat") for e in s.events] == [
            "gen_ai.first_chunk"
        ]
    else:
        assert call.traceparent == ""  # nothing for the plugin to continue


def test_a_failed_plugin_call_is_an_error_span_with_its_exception() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(SimpleSpanProcessor(exporter))
    with (
        pytest.raises(RuntimeError, match="down"),
        tracing.plugin_call("p", "agent/request", "a9", 0, 0),
    ):
        raise RuntimeError("down")
    tracing.shutdown()
    [span] = exporter.get_finished_spans()
    assert span.parent is None  # no turn open: a root of its own
    assert span.status.description == "RuntimeError: down"
    assert [(e.name, (e.attributes or {}).get("exception.message")) for e in span.events] == [
        ("exception", "down")
    ]
