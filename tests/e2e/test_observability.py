"""Traces, metrics and logs of a real server: the span tree of a turn, a scrape of the
metrics endpoint over HTTP, and the JSON log lines of a server process."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import stream_pb2 as st
from server.kernel import seams as S
from server.models.scripted_options import script_options
from server.observability.logs import JsonFormatter
from server.observability.telemetry import Telemetry
from server.observability.tracing import Tracing
from server.settings.config import Config, load_config
from tests.e2e.conftest import E2E, READ_TIMEOUT, Client, EventStream, read_turn, running_app
from tests.e2e.registry import register
from tests.e2e.test_approvals import ALLOW, WORD_COUNT_THEN_DONE, approval_options
from tests.fake_openai import FakeOpenAI, Reply, text, usage
from tests.processes import PluginLauncher, configurable, free_port, server_process

T = READ_TIMEOUT


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[tuple[E2E, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    config = Config(listen="127.0.0.1:0", store="memory", agents=())
    telemetry = Telemetry(config, tracing=Tracing(SimpleSpanProcessor(exporter)))
    async with running_app(config, telemetry) as e2e:
        yield e2e, exporter


async def turn(client: Client, agent_id: str, text: str) -> None:
    sent = await client.agents.SendMessage(
        api.SendMessageRequest(agent_id=agent_id, text=text), timeout=T
    )
    events = await read_turn(client.agents, agent_id, sent.next_seq)
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_turn_is_one_span_tree(
    traced: tuple[E2E, InMemorySpanExporter], launcher: PluginLauncher
) -> None:
    e2e, exporter = traced
    plugin = await launcher.start(configurable("python", "--name", "tagger", "--tag", "T"))
    await register(e2e.channel, plugin.address)
    usage = c.Usage(input_tokens=12, output_tokens=5)
    script = [
        scripted_pb2.ScriptedStep(
            tool_calls=[
                scripted_pb2.ScriptedToolCall(name="word_count", arguments='{"text": "a b"}')
            ],
            usage=usage,
        ),
        scripted_pb2.ScriptedStep(text="two words", usage=usage),
    ]
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(
            agent_id="traced",
            options=agent_pb2.AgentOptions(
                tools=["word_count"], provider_options=script_options(script)
            ),
        ),
        timeout=T,
    )
    await turn(e2e, "traced", "count a b")
    await e2e.app.stop(grace=0)  # flushes the spans
    spans = list(exporter.get_finished_spans())

    [root] = by_name(spans, "agent turn")
    assert root.parent is None
    assert root.attributes is not None
    assert root.attributes["gen_ai.agent.id"] == "traced"
    assert root.attributes["agentloop.turn.end_reason"] == "completed"
    tree = [s for s in spans if s.context.trace_id == root.context.trace_id]
    steps = by_name(tree, "agent step")
    assert len(steps) == 2
    assert all(parent_of(step) == root.context.span_id for step in steps)
    step_ids = [step.context.span_id for step in sorted(steps, key=lambda s: s.start_time or 0)]

    models = sorted(by_name(tree, "chat echo"), key=lambda s: s.start_time or 0)
    assert [parent_of(m) for m in models] == step_ids
    for model in models:
        attrs = model.attributes or {}
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "scripted"
        assert attrs["gen_ai.request.model"] == "echo"
        assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("stop",)  # type: ignore[arg-type]
        assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (12, 5)
        assert [event.name for event in model.events] == ["gen_ai.first_chunk"]

    [tool] = by_name(tree, "execute_tool word_count")
    assert parent_of(tool) == step_ids[0]
    assert (tool.attributes or {})["gen_ai.tool.name"] == "word_count"

    [plugin_call] = by_name(tree, "plugin tagger agent/prompt-submit")
    assert parent_of(plugin_call) == root.context.span_id  # before any step
    # Each span lies within its parent.
    ids = {span.context.span_id: span for span in tree}
    for span in tree:
        parent = ids.get(parent_of(span) or 0)
        if parent is not None:
            assert parent.start_time is not None and span.start_time is not None
            assert parent.end_time is not None and span.end_time is not None
            assert parent.start_time <= span.start_time <= span.end_time <= parent.end_time

    [send] = by_name(spans, "agentloop.v1.AgentService/SendMessage")
    assert (send.attributes or {})["rpc.method"] == "SendMessage"
    assert send.context.trace_id != root.context.trace_id  # the turn runs after the reply


async def test_tracing_off_registers_nothing() -> None:
    config = Config(listen="127.0.0.1:0", store="memory", agents=())
    async with running_app(config) as e2e:
        assert e2e.app.telemetry.tracing is None and e2e.app.telemetry.metrics is None
        assert not e2e.app.runtime.seams.has(S.SESSION_EVENT, None)


# -- a server process: metrics over HTTP and JSON logs ---------------------------------


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=T) as response:
        return str(response.read().decode())


def scrape(port: int) -> dict[str, float]:
    """Every sample on the endpoint, by `name{label="value",...}`."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(scrape_text(port)):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
}


def exported_series(text: str) -> set[str]:
    """Every series name the endpoint exports, a family with no sample yet included."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "agentloop.json"


def dashboard_series() -> set[str]:
    """The metric names the Grafana dashboard's queries read."""
    board = json.loads(DASHBOARD.read_text())
    queries = [
        target["expr"]
        for panel in board["panels"]
        for target in panel.get("targets", ())
    ]  # fmt: skip
    assert len(queries) > 30
    return {
        name
        for query in queries
        for name in re.findall(r"\b([a-z_]+)\{", query)  # a series is selected by its labels
    }


async def test_metrics_and_json_logs_of_a_server_process(
    tmp_path: Path, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(configurable("python", "--name", "tagger", "--tag", "T"))
    metrics_port = free_port()
    config = tmp_path / "agentloop.yaml"
    config.write_text(
        f"listen: 127.0.0.1:0\nstore: memory\nlogFormat: json\nmetricsListen: {metrics_port}\n"
        "retention:\n  requestRecordHours: 24\n  sweepIntervalSeconds: 3600\n"
        "agents:\n  - id: assistant\n    tools: [word_count]\n"
        f"plugins:\n  - address: {plugin.address}\n"
    )
    stderr = tmp_path / "server.stderr"
    async with server_process("--config", str(config), stderr_path=stderr) as server:
        address = await server.listening_address()
        channel = grpc.aio.insecure_channel(address)
        client = Client(channel)
        try:
            before = await asyncio.to_thread(scrape, metrics_port)
            for i in range(3):
                await turn(client, "assistant", f"count these {i} words")
            failing = scripted_pb2.ScriptedStep(
                finish=st.FINISH_KIND_ERROR, error_message="scripted failure", error_code="BOOM"
            )
            await client.factory.CreateAgent(
                fac.CreateAgentRequest(
                    agent_id="failing",
                    options=agent_pb2.AgentOptions(provider_options=script_options([failing])),
                ),
                timeout=T,
            )
            sent = await client.agents.SendMessage(
                api.SendMessageRequest(agent_id="failing", text="go"), timeout=T
            )
            await read_turn(client.agents, "failing", sent.next_seq)
            after = await asyncio.to_thread(scrape, metrics_port)
            exported = exported_series(await asyncio.to_thread(scrape_text, metrics_port))
        finally:
            await channel.close()
        assert await server.terminate() == 0

    def moved(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert moved('agentloop_turns_total{reason="completed"}') == 3
    assert moved('agentloop_turns_total{reason="error"}') == 1
    assert moved("agentloop_turn_duration_seconds_count{}") == 4
    assert moved("agentloop_step_duration_seconds_count{}") == 7  # 2 per good turn, 1 failing
    assert moved("agentloop_model_first_chunk_seconds_count{}") == 7
    assert moved('agentloop_tool_calls_total{outcome="ok",tool="word_count"}') == 3
    assert moved('agentloop_tool_duration_seconds_count{tool="word_count"}') == 3
    send_rpc = 'grpc_method="SendMessage",grpc_service="agentloop.v1.AgentService"'
    assert moved(f'agentloop_rpcs_total{{grpc_code="OK",{send_rpc}}}') == 4
    assert moved(f"agentloop_rpc_duration_seconds_count{{{send_rpc}}}") == 4
    assert moved('agentloop_model_tokens_total{kind="output",model="echo",provider="scripted"}')
    assert after["agentloop_turns_running{}"] == 0 and after["agentloop_messages_queued{}"] == 0
    assert after["agentloop_approvals_pending{}"] == 0
    assert sum(v for k, v in after.items() if k.startswith("agentloop_model_errors_total{")) == 1
    assert moved("agentloop_store_commit_seconds_count{}") > 0
    assert after["agentloop_agents{}"] == 2
    assert "agentloop_event_loop_lag_seconds_count{}" in after
    assert "agentloop_open_streams{}" in after
    assert after["agentloop_plugins{}"] == 1
    assert moved('agentloop_plugin_calls_total{plugin="tagger"}') == 4  # one prompt per turn
    prompts = 'plugin="tagger",seam="agent/prompt-submit"'
    assert moved(f"agentloop_plugin_call_seconds_count{{{prompts}}}") == 4
    assert moved(f'agentloop_plugin_call_seconds_bucket{{le="+Inf",{prompts}}}') == 4
    # The dashboard in the repository reads only series this server exports.
    missing = dashboard_series() - exported
    assert not missing, f"the dashboard reads series the server does not export: {missing}"
    for family in ("agentloop_approvals_total", "agentloop_model_retries_total"):
        assert family in exported  # declared before the first sample
    assert after['agentloop_plugin_fail_opens_total{plugin="tagger"}'] == 0
    (build,) = [name for name in after if name.startswith("agentloop_build_info{")]
    assert after[build] == 1 and 'version="0.1.0"' in build and 'sdk_version="0.1.0"' in build
    assert after["process_cpu_seconds_total{}"] > 0 and after["process_resident_memory_bytes{}"]
    assert 'python_gc_collections_total{generation="0"}' in after

    banner = json.loads(server.banner)  # stdout is JSON too
    assert banner["message"].startswith("agentloop listening on ") and banner["listen"]
    assert banner["level"] == "INFO" and banner["time"].endswith("Z")
    lines = [json.loads(line) for line in stderr.read_text().splitlines() if line.strip()]
    access = [r for r in lines if r.get("logger") == "agentloop.access"]
    sends = [r for r in access if r["method"] == "/agentloop.v1.AgentService/SendMessage"]
    assert len(sends) == 4
    for record in sends:
        assert record["level"] == "INFO" and record["code"] == "OK"
        assert isinstance(record["duration_ms"], float) and record["peer"].startswith("ipv4:")
    started = next(r for r in lines if r["message"].startswith("agent assistant started"))
    assert started["agent"] == "assistant" and started["session"].startswith("assistant-session-")
    failed: dict[str, Any] = next(r for r in lines if "scripted failure" in r["message"])
    assert failed["level"] == "WARNING"
    assert (failed["agent"], failed["turn"], failed["step"]) == ("failing", 1, 1)
    assert failed["session"].startswith("failing-session-")


async def test_a_log_line_about_a_traced_turn_carries_its_trace_and_span_ids(
    traced: tuple[E2E, InMemorySpanExporter], caplog: pytest.LogCaptureFixture
) -> None:
    e2e, exporter = traced
    caplog.set_level(logging.INFO)
    failing = scripted_pb2.ScriptedStep(
        finish=st.FINISH_KIND_ERROR, error_message="scripted failure", error_code="BOOM"
    )
    await e2e.create("traced-log", provider="scripted", provider_options=script_options([failing]))
    await (await e2e.send("traced-log", "go")).result()
    (failed,) = [r for r in caplog.records if "scripted failure" in r.getMessage()]
    # Logged as the turn ends (its step has closed): the turn's span.
    (turn_span,) = by_name(list(exporter.get_finished_spans()), "agent turn")
    line = json.loads(JsonFormatter().format(failed))
    assert line["trace_id"] == format(turn_span.context.trace_id, "032x")
    assert line["span_id"] == format(turn_span.context.span_id, "016x")
    assert line["agent"] == "traced-log"
    # A line about no agent (an RPC's access line) carries no ids.
    access = [r for r in caplog.records if r.name == "agentloop.access"]
    assert access and not any(hasattr(r, "trace_id") for r in access)


async def test_a_client_traceparent_continues_into_the_rpc_and_the_turn_links_to_it(
    traced: tuple[E2E, InMemorySpanExporter],
) -> None:
    e2e, exporter = traced
    await e2e.create("linked", provider="scripted", model="echo")
    client_trace, client_span = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    calls = {
        "sampled": f"00-{client_trace:032x}-{client_span:016x}-01",
        "unsampled": f"00-{client_trace:032x}-{client_span:016x}-00",
        "malformed": f"00-{client_trace:032x}-0000000000000000-01",
    }
    for label, header in calls.items():
        sent = await e2e.agents.SendMessage(
            api.SendMessageRequest(agent_id="linked", text=label),
            metadata=(("traceparent", header), ("tracestate", "vendor=1")),
            timeout=T,
        )
        await read_turn(e2e.agents, "linked", sent.next_seq)
    spans = list(exporter.get_finished_spans())
    sends = by_name(spans, "agentloop.v1.AgentService/SendMessage")
    # The sampled call continues the client's trace; the unsampled one records nothing;
    # the malformed header is ignored (a trace of its own).
    assert len(sends) == 2
    continued, own = sends
    assert continued.context.trace_id == client_trace
    assert continued.parent is not None and continued.parent.is_remote
    assert continued.parent.span_id == client_span
    assert own.parent is None and own.context.trace_id != client_trace
    # Each turn is a trace of its own, linked to the RPC that queued its message.
    turns = by_name(spans, "agent turn")
    assert len(turns) == 3
    assert [link.context.span_id for link in turns[0].links] == [continued.context.span_id]
    assert list(turns[1].links) == []  # its RPC was not sampled: nothing to link to
    assert [link.context.span_id for link in turns[2].links] == [own.context.span_id]
    steps = by_name(spans, "agent step")
    assert {s.context.trace_id for s in steps} == {t.context.trace_id for t in turns}


JSON_ONLY = """
import os, subprocess, sys, threading, warnings
from server.observability.json_streams import capture
from server.observability.logs import setup_logging
setup_logging("INFO", "json", capture())
warnings.warn("a library's warning")
os.write(2, b"written to descriptor 2, as gRPC's C core writes\\n")
print("a library printing to stderr", file=sys.stderr)
subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('a child\\\\n')"])
thread = threading.Thread(target=lambda: 1 / 0, name="worker")
thread.start()
thread.join()
raise RuntimeError("uncaught at the top")
"""


async def test_nothing_but_json_on_stderr_under_json_logs(tmp_path: Path) -> None:
    """Warnings, raw writes to descriptor 2, a child's stderr and uncaught exceptions
    (in a thread and at the top) each come out as JSON lines, in a real process."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", JSON_ONLY, cwd=Path(__file__).parents[2],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), T)
    assert proc.returncode == 1
    records = [json.loads(line) for line in err.decode().splitlines()]  # every line is JSON
    by_message = {r["message"]: r for r in records}
    assert "a library's warning" in next(m for m in by_message if "UserWarning" in m)
    assert by_message["written to descriptor 2, as gRPC's C core writes"]["logger"] == "stderr"
    assert by_message["a library printing to stderr"]["level"] == "WARNING"
    assert by_message["a child"]["logger"] == "stderr"
    worker = by_message["uncaught ZeroDivisionError in thread worker: division by zero"]
    assert worker["level"] == "CRITICAL" and "Traceback" in worker["exception"]
    top = by_message["uncaught RuntimeError: uncaught at the top"]
    assert top["level"] == "CRITICAL" and "Traceback" in top["exception"]


async def test_approvals_model_errors_retries_and_tokens_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An in-process server with metrics on: an approval waits, then is allowed; a model
    provider answers 429 once, then a turn with usage; a scripted model fails."""
    monkeypatch.setenv("FAKE_OPENAI_KEY", "k")
    async with FakeOpenAI() as fake:
        fake.script(
            Reply(status=429, body={"error": {"message": "slow down"}},
                  headers={"retry-after-ms": "10"}),
            Reply(events=[*text("hi"), usage(7, 2)]),
        )  # fmt: skip
        config_file = tmp_path / "agentloop.yaml"
        config_file.write_text(
            "listen: 127.0.0.1:0\nstore: memory\nagents: []\nmetricsListen: 127.0.0.1:0\n"
            f"providers:\n  - name: fake\n    baseUrl: {fake.base_url}\n"
            "    apiKeyEnv: FAKE_OPENAI_KEY\n    defaultModel: gpt-test\n"
            "    initialBackoffSeconds: 0.01\n"
        )
        async with running_app(load_config(config_file)) as e2e:
            port = e2e.app.telemetry.metrics_port
            options = approval_options(*WORD_COUNT_THEN_DONE)
            await e2e.factory.CreateAgent(
                fac.CreateAgentRequest(agent_id="asker", options=options), timeout=T
            )
            sent = await e2e.agents.SendMessage(
                api.SendMessageRequest(agent_id="asker", text="count"), timeout=T
            )
            with EventStream(e2e.agents, agent_id="asker", from_seq=sent.next_seq) as stream:
                requested = (await stream.until("approval_requested")).approval_requested
                waiting = await asyncio.to_thread(scrape, port)
                await e2e.agents.ResolveApproval(
                    api.ResolveApprovalRequest(
                        agent_id="asker", approval_id=requested.approval_id, decision=ALLOW
                    ),
                    timeout=T,
                )
                await stream.until("turn_end")
            fake_agent = agent_pb2.AgentOptions(provider="fake")
            await e2e.factory.CreateAgent(
                fac.CreateAgentRequest(agent_id="remote", options=fake_agent), timeout=T
            )
            await turn(e2e, "remote", "hello")
            failing = scripted_pb2.ScriptedStep(
                finish=st.FINISH_KIND_ERROR, error_message="scripted failure", error_code="BOOM"
            )
            await e2e.create("failing", provider="scripted", provider_options=script_options(
                [failing]))  # fmt: skip
            await (await e2e.send("failing", "go")).result()
            after = await asyncio.to_thread(scrape, port)
    assert waiting["agentloop_approvals_pending{}"] == 1
    assert waiting["agentloop_turns_running{}"] == 1
    assert after["agentloop_approvals_pending{}"] == 0
    assert after['agentloop_approvals_total{outcome="allowed_once"}'] == 1
    assert after["agentloop_approval_wait_seconds_count{}"] == 1
    assert after['agentloop_model_retries_total{cause="HTTP 429",provider="fake"}'] == 1
    tokens = 'model="gpt-test",provider="fake"'
    assert after[f'agentloop_model_tokens_total{{kind="input",{tokens}}}'] == 7
    assert after[f'agentloop_model_tokens_total{{kind="output",{tokens}}}'] == 2
    errors = {k: v for k, v in after.items() if k.startswith("agentloop_model_errors_total{")}
    assert errors == {'agentloop_model_errors_total{model="echo",provider="scripted"}': 1}
    assert after["agentloop_turns_running{}"] == 0
