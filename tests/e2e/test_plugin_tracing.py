"""Trace context crosses into plugins: a real Python plugin process, with OpenTelemetry
configured there, makes its spans children of the server's plugin-call spans.

The server's spans go to an in-memory exporter; the plugin's to a file it writes
(tests/plugins/traced.py). With tracing off, calls carry no `traceparent`; a plugin
without OpenTelemetry installed still serves, and still sees the `traceparent`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.models.scripted_options import script_options
from server.observability.telemetry import Telemetry
from server.observability.tracing import Tracing
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, read_turn, running_app
from tests.e2e.registry import register
from tests.processes import TEST_PLUGINS, PluginLauncher

T = READ_TIMEOUT


def traced_plugin(spans_file: Path, *flags: str) -> list[str]:
    """The command line of the span-exporting test plugin (without --listen)."""
    return [sys.executable, str(TEST_PLUGINS / "traced.py"), "--spans-file", str(spans_file),
            *flags]  # fmt: skip


def records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines the plugin wrote so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def wait_for_records(path: Path, done: Any) -> list[dict[str, Any]]:
    """Poll the plugin's file until `done(records)` holds (bounded by READ_TIMEOUT)."""
    deadline = time.monotonic() + T
    while not done(found := records(path)):
        assert time.monotonic() < deadline, f"the plugin wrote only {found}"
        await asyncio.sleep(0.02)
    return found


async def one_turn(e2e: E2E, agent_id: str) -> list[ev.SessionEvent]:
    """An agent that calls the plugin's tool once, then answers; its one turn's events."""
    script = [
        scripted_pb2.ScriptedStep(
            tool_calls=[
                scripted_pb2.ScriptedToolCall(name="traced_echo", arguments='{"text": "hi"}')
            ]
        ),
        scripted_pb2.ScriptedStep(text="done"),
    ]
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(
            agent_id=agent_id,
            options=agent_pb2.AgentOptions(
                tools=["traced_echo"], provider_options=script_options(script)
            ),
        ),
        timeout=T,
    )
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id=agent_id, text="hello"), timeout=T
    )
    events = await read_turn(e2e.agents, agent_id, sent.next_seq)
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    [prompt] = [e for e in events if e.HasField("user_message")]
    assert prompt.user_message.content[0].text.text == "hello-traced"  # the plugin ran
    [result] = [e for e in events if e.HasField("tool_result")]
    assert not result.tool_result.is_error
    return events


@pytest.fixture
async def traced_server() -> AsyncIterator[tuple[E2E, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    config = Config(listen="127.0.0.1:0", store="memory", agents=())
    telemetry = Telemetry(config, tracing=Tracing(SimpleSpanProcessor(exporter)))
    async with running_app(config, telemetry) as e2e:
        yield e2e, exporter


def traceparent_of(span: ReadableSpan) -> str:
    context = span.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def only(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    [span] = [s for s in spans if s.name == name]
    return span


async def test_a_python_plugins_spans_are_children_of_the_server_plugin_call_spans(
    traced_server: tuple[E2E, InMemorySpanExporter], launcher: PluginLauncher, tmp_path: Path
) -> None:
    e2e, exporter = traced_server
    spans_file = tmp_path / "plugin-spans.jsonl"
    plugin = await launcher.start(traced_plugin(spans_file))
    await register(e2e.channel, plugin.address)
    await one_turn(e2e, "traced")

    def complete(found: list[dict[str, Any]]) -> bool:
        names = {r.get("name") for r in found}
        return {"handle prompt_submit", "handle tool_execute", "tag prompt"} <= names

    found = await wait_for_records(spans_file, complete)
    server = list(exporter.get_finished_spans())  # the turn's spans have ended
    root = only(server, "agent turn")
    prompt_call = only(server, "plugin traced agent/prompt-submit")
    tool_call = only(server, "plugin traced tools/execute")
    trace_id = f"{root.context.trace_id:032x}"
    assert prompt_call.context.trace_id == tool_call.context.trace_id == root.context.trace_id
    [step] = [s for s in server if s.name == "agent step" and s.context.span_id == (
        tool_call.parent.span_id if tool_call.parent else 0)]  # fmt: skip
    assert step.parent is not None and step.parent.span_id == root.context.span_id

    spans = {r["name"]: r for r in found if "name" in r}
    handle_prompt = spans["handle prompt_submit"]
    assert handle_prompt["trace_id"] == trace_id
    assert handle_prompt["parent_span_id"] == f"{prompt_call.context.span_id:016x}"
    assert handle_prompt["remote_parent"] is True
    handle_tool = spans["handle tool_execute"]
    assert handle_tool["trace_id"] == trace_id
    assert handle_tool["parent_span_id"] == f"{tool_call.context.span_id:016x}"
    # A span the handler makes itself joins the trace under the helper's span.
    inner = spans["tag prompt"]
    assert (inner["trace_id"], inner["parent_span_id"]) == (trace_id, handle_prompt["span_id"])

    # A model served by the plugin: its call carries the span of the model stream.
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(
            agent_id="modelled", options=agent_pb2.AgentOptions(provider="traced-model")
        ),
        timeout=T,
    )
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id="modelled", text="hi"), timeout=T
    )
    modelled = await read_turn(e2e.agents, "modelled", sent.next_seq)
    assert modelled[-1].turn_end.reason.WhichOneof("kind") == "completed"
    later = await wait_for_records(
        spans_file, lambda r: any(x.get("name") == "handle model_stream" for x in r)
    )
    await e2e.app.stop(grace=0)  # flushes the server's spans
    server = list(exporter.get_finished_spans())
    model_call = only(server, "plugin traced model/stream")
    [model_turn] = [s for s in server if s.name == "agent turn" and s.context.trace_id == (
        model_call.context.trace_id)]  # fmt: skip
    [handle_model] = [r for r in later if r.get("name") == "handle model_stream"]
    assert handle_model["trace_id"] == f"{model_turn.context.trace_id:032x}"
    assert handle_model["parent_span_id"] == f"{model_call.context.span_id:016x}"

    # The handlers saw the traceparent of the server's span of their call.
    seen = {r["call"]: r for r in found if "call" in r}
    assert seen["prompt_submit"]["traceparent"] == traceparent_of(prompt_call)
    assert seen["prompt_submit"]["otel"] is True
    assert seen["tool_execute"]["traceparent"] == traceparent_of(tool_call)
    [model_seen] = [r for r in later if r.get("call") == "model_stream"]
    assert model_seen["traceparent"] == traceparent_of(model_call)


async def test_a_plugin_without_opentelemetry_serves_and_sees_the_traceparent(
    traced_server: tuple[E2E, InMemorySpanExporter], launcher: PluginLauncher, tmp_path: Path
) -> None:
    e2e, exporter = traced_server
    spans_file = tmp_path / "plugin-records.jsonl"
    plugin = await launcher.start(traced_plugin(spans_file, "--no-otel"))
    await register(e2e.channel, plugin.address)
    await one_turn(e2e, "plain")
    found = await wait_for_records(spans_file, lambda r: len(r) >= 2)
    await e2e.app.stop(grace=0)
    prompt_call = only(list(exporter.get_finished_spans()), "plugin traced agent/prompt-submit")
    [seen] = [r for r in found if r.get("call") == "prompt_submit"]
    assert seen == {"call": "prompt_submit", "traceparent": traceparent_of(prompt_call),
                    "otel": False}  # fmt: skip
    assert not [r for r in found if "name" in r]  # no spans: OpenTelemetry is not there


async def test_no_traceparent_while_the_server_does_not_trace(
    launcher: PluginLauncher, tmp_path: Path
) -> None:
    spans_file = tmp_path / "plugin-spans.jsonl"
    plugin = await launcher.start(traced_plugin(spans_file))
    async with running_app(Config(listen="127.0.0.1:0", store="memory", agents=())) as e2e:
        await register(e2e.channel, plugin.address)
        await one_turn(e2e, "untraced")
        found = await wait_for_records(spans_file, lambda r: len(r) >= 3)
    seen = {r["call"]: r["traceparent"] for r in found if "call" in r}
    assert seen == {"prompt_submit": "", "tool_execute": ""}
    # The helper made no span of its own; the handler's span starts a trace of its own.
    assert [(r["name"], r["parent_span_id"]) for r in found if "name" in r] == [("tag prompt", "")]


async def test_a_client_span_reaches_the_turn_and_the_plugin_over_grpc_and_http(
    launcher: PluginLauncher, tmp_path: Path
) -> None:
    """A client's `traceparent` on SendMessage, sent over gRPC and over the HTTP side:
    the RPC's span is the client span's child, the turn it queued links to it, and the
    turn's plugin call (and the plugin's own span under it) share the turn's trace."""
    exporter = InMemorySpanExporter()
    config = Config(
        listen="127.0.0.1:0", http_listen="127.0.0.1:0", store="memory", agents=()
    )  # fmt: skip
    telemetry = Telemetry(config, tracing=Tracing(SimpleSpanProcessor(exporter)))
    spans_file = tmp_path / "plugin-spans.jsonl"
    plugin = await launcher.start(traced_plugin(spans_file))
    clients = {  # the client's trace and span, per way in
        "grpc": (0x1AF7651916CD43DD8448EB211C80319C, 0x17AD6B7169203331),
        "http": (0x2AF7651916CD43DD8448EB211C80319C, 0x27AD6B7169203331),
    }
    async with running_app(config, telemetry) as e2e:
        await register(e2e.channel, plugin.address)
        await e2e.factory.CreateAgent(
            fac.CreateAgentRequest(
                agent_id="joined", options=agent_pb2.AgentOptions(provider="scripted", model="echo")
            ),
            timeout=T,
        )
        for way, (trace_id, span_id) in clients.items():
            header = f"00-{trace_id:032x}-{span_id:016x}-01"
            if way == "grpc":
                sent = await e2e.agents.SendMessage(
                    api.SendMessageRequest(agent_id="joined", text=way),
                    metadata=(("traceparent", header),),
                    timeout=T,
                )
                next_seq = sent.next_seq
            else:
                assert e2e.app.http is not None
                async with httpx.AsyncClient(timeout=T) as http:
                    answer = await http.post(
                        f"http://127.0.0.1:{e2e.app.http.port}"
                        "/api/agentloop.v1.AgentService/SendMessage",
                        json={"agentId": "joined", "text": way},
                        headers={"traceparent": header},
                    )
                assert answer.status_code == 200, answer.text
                next_seq = int(answer.json()["nextSeq"])
            events = await read_turn(e2e.agents, "joined", next_seq)
            assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
        found = await wait_for_records(
            spans_file,
            lambda r: sum(x.get("name") == "handle prompt_submit" for x in r) == 2,
        )
        await e2e.app.stop(grace=0)  # flushes the server's spans
    server = list(exporter.get_finished_spans())
    handles = [r for r in found if r.get("name") == "handle prompt_submit"]
    for trace_id, span_id in clients.values():
        [rpc] = [s for s in server if s.context.trace_id == trace_id]
        assert rpc.name == "agentloop.v1.AgentService/SendMessage"
        assert rpc.parent is not None and rpc.parent.span_id == span_id and rpc.parent.is_remote
        [turn] = [
            s for s in server
            if s.name == "agent turn" and [link.context.span_id for link in s.links] == [
                rpc.context.span_id]
        ]  # fmt: skip
        [call] = [
            s for s in server
            if s.name == "plugin traced agent/prompt-submit"
            and s.context.trace_id == turn.context.trace_id
        ]  # fmt: skip
        [handle] = [h for h in handles if h["trace_id"] == f"{turn.context.trace_id:032x}"]
        assert handle["parent_span_id"] == f"{call.context.span_id:016x}"
