"""Plugins as real processes (Python and Node) against a real server, through the real API.

Every plugin here is a separate OS process started with `--listen 127.0.0.1:0`; the test
reads its `plugin NAME listening on HOST:PORT` line, registers the address with
`PluginRegistryService/RegisterPlugin` and waits for `ListPlugins` to show it READY. The
plugins are the shipped examples (`clients/python/examples/guard_plugin.py`,
`clients/node/examples/guard-plugin.js`) and the test plugins `tests/plugins/configurable.py`
and `tests/plugins/configurable.js`, whose behaviour is chosen by flags.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import hook_service_pb2_grpc as hk_rpc
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2, session_event_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import content_pb2 as c
from agentloop.v1.stream_pb2 import StreamChunk
from server.kernel.abort import AbortSignal
from server.models import ModelRequest
from server.models.scripted import ScriptedModel
from server.models.scripted_options import script_options
from server.settings.config import Config, PluginConfig
from tests.e2e.conftest import (
    E2E,
    READ_TIMEOUT,
    EventStream,
    kinds,
    of_kind,
    read_turn,
    running_app,
    text_of,
)
from tests.e2e.registry import (
    eventually,
    list_plugins,
    plugin_state,
    register,
    unregister,
    wait_state,
)
from tests.processes import PluginLauncher, configurable, free_port, guard_example

T = READ_TIMEOUT
"""The deadline of every unary call and of every wait."""

FOREVER = 3600
"""Seconds a "slow" plugin handler sleeps: it can only end by being cancelled."""

LANGS = ["python", "node"]
"""Each "each" test runs once per plugin language."""

Event = session_event_pb2.SessionEvent

pytestmark = pytest.mark.usefixtures("without_tokens")
"""The fixture servers and the plugin processes run without any token."""


# -- the API -----------------------------------------------------------------------------


async def create_agent(
    e2e: E2E,
    agent_id: str,
    *,
    tools: Sequence[str] = (),
    script: Sequence[scripted_pb2.ScriptedStep] = (),
) -> None:
    """A scripted agent (with no script it echoes "You said: <latest user text>")."""
    options = agent_pb2.AgentOptions(
        provider="scripted", model="m", tools=list(tools), provider_options=script_options(script)
    )
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id=agent_id, options=options), timeout=T
    )


async def run_turn(e2e: E2E, agent_id: str, text: str) -> list[Event]:
    """Send a message and read its turn up to the turn_end."""
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id=agent_id, text=text), timeout=T
    )
    return await read_turn(e2e.agents, agent_id, sent.next_seq)


async def wait_call_sent(channel: grpc.aio.Channel, name: str) -> None:
    """Wait until the plugin `name` has been sent a call (it is in flight or answered)."""

    async def sent() -> bool:
        return (await plugin_state(channel, name)).stats.calls >= 1

    await eventually(sent, f"a call to be sent to plugin {name}")


def end_reason(events: Sequence[Event]) -> session_event_pb2.TurnEndReason:
    """The reason of the turn's (last) turn_end."""
    assert events and events[-1].WhichOneof("payload") == "turn_end", kinds(list(events))
    return events[-1].turn_end.reason


def plugin_error(events: Sequence[Event], code: str, plugin: str) -> str:
    """The turn ended in an error with `code` naming `plugin`; returns the error message."""
    reason = end_reason(events)
    assert reason.WhichOneof("kind") == "error", reason
    assert reason.error.code == code, reason.error
    assert f'plugin "{plugin}"' in reason.error.message, reason.error.message
    return reason.error.message


def user_text(events: Sequence[Event]) -> str:
    """The text of the turn's user_message."""
    (user,) = of_kind(events, "user_message")
    return text_of(user.user_message.content)


def assistant_text(events: Sequence[Event]) -> str:
    """The text of the turn's assistant messages, joined."""
    return "".join(
        text_of(e.assistant_message.content) for e in of_kind(events, "assistant_message")
    )


def step(*calls: tuple[str, str, dict[str, object]], text: str = "") -> scripted_pb2.ScriptedStep:
    """One scripted model call: `text`, then tool calls (id, name, arguments)."""
    return scripted_pb2.ScriptedStep(
        text=text,
        tool_calls=[
            scripted_pb2.ScriptedToolCall(id=call_id, name=name, arguments=json.dumps(arguments))
            for call_id, name, arguments in calls
        ],
    )


# -- seams, for each plugin language -------------------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
async def test_blocked_prompt_gives_a_rejected_turn(
    e2e: E2E, launcher: PluginLauncher, lang: str
) -> None:
    plugin = await launcher.start(guard_example(lang))
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "guarded")

    events = await run_turn(e2e, "guarded", "please rm -rf / now")

    assert kinds(events) == ["turn_start", "prompt_blocked", "turn_end"]
    assert events[1].prompt_blocked.reason == "destructive command"
    assert text_of(events[1].prompt_blocked.content) == "please rm -rf / now"
    reason = end_reason(events)
    assert reason.WhichOneof("kind") == "rejected"
    assert reason.rejected.reason == "destructive command"

    # Any other prompt is allowed, with the example's clock note as a context.
    events = await run_turn(e2e, "guarded", "hello")
    assert end_reason(events).WhichOneof("kind") == "completed"
    k = kinds(events)
    assert k[1:3] == ["user_message", "context_message"]
    note = events[2].context_message
    assert "The plugin's clock reads" in text_of(note.content)
    assert (note.source.kind, note.source.name) == ("plugin", plugin.name)


class RecordingModel:
    """The scripted model, recording the messages of every request it gets."""

    def __init__(self) -> None:
        self.inner = ScriptedModel()
        self.requests: list[list[c.Message]] = []

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamChunk]:
        self.requests.append(list(request.messages))
        return self.inner.stream(request, signal)


@pytest.mark.parametrize("lang", LANGS)
async def test_prompt_rewrite_and_context_reach_the_model(
    e2e: E2E, launcher: PluginLauncher, lang: str
) -> None:
    recording = RecordingModel()
    e2e.app.runtime.models.register("recording", recording, default_model="m")
    plugin = await launcher.start(
        configurable(lang, "--name", f"rewriter-{lang}", "--tag", "T", "--context", "ctx note")
    )
    await register(e2e.channel, plugin.address)
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(
            agent_id="echo", options=agent_pb2.AgentOptions(provider="recording")
        ),
        timeout=T,
    )

    events = await run_turn(e2e, "echo", "p")

    assert end_reason(events).WhichOneof("kind") == "completed"
    # The session log: the rewritten prompt, then the plugin's context.
    k = kinds(events)
    user_at = k.index("user_message")
    assert k[user_at + 1] == "context_message", k
    assert text_of(events[user_at].user_message.content) == "p-T"
    note = events[user_at + 1].context_message
    assert text_of(note.content) == "ctx note"
    assert (note.source.kind, note.source.name) == ("plugin", plugin.name)
    # The model request: the rewritten prompt, then the context (wrapped), last.
    (messages,) = recording.requests
    assert [(m.role, text_of(m.content)) for m in messages[-2:]] == [
        (c.ROLE_USER, "p-T"),
        (c.ROLE_USER, '<context source="plugin">\nctx note\n</context>'),
    ]
    # The scripted model echoes the latest user text it was sent: the context.
    assert assistant_text(events) == 'You said: <context source="plugin">\nctx note\n</context>'


@pytest.mark.parametrize("lang", LANGS)
async def test_pre_execute_deny_is_an_error_result_the_model_sees(
    e2e: E2E, launcher: PluginLauncher, lang: str
) -> None:
    plugin = await launcher.start(
        configurable(lang, "--name", f"denier-{lang}", "--deny-tool", "echo",
                     "--deny-reason", "echo is off limits")
    )  # fmt: skip
    await register(e2e.channel, plugin.address)
    # Step 1 calls echo; step 2 is the scripted model's default: it summarises the
    # tool results it was sent.
    await create_agent(e2e, "denied", tools=["echo"], script=[step(("e1", "echo", {"text": "hi"}))])

    events = await run_turn(e2e, "denied", "go")

    assert end_reason(events).WhichOneof("kind") == "completed"
    (result,) = of_kind(events, "tool_result")
    assert result.tool_result.call_id == "e1"
    assert result.tool_result.is_error
    assert text_of(result.tool_result.content) == "Error: echo is off limits"
    assert "Tool results: Error: echo is off limits" in assistant_text(events)


@pytest.mark.parametrize("lang", LANGS)
async def test_plugin_tool_runs_in_the_pool_beside_a_local_tool(
    e2e: E2E, launcher: PluginLauncher, lang: str
) -> None:
    tool = f"nap_{lang}"
    plugin = await launcher.start(
        configurable(lang, "--name", f"napper-{lang}", "--tool", tool, "--tool-sleep", "0.3")
    )
    registered = await register(e2e.channel, plugin.address)
    assert [(t.name, t.parallel_safe) for t in registered.tools] == [(tool, True)]
    await create_agent(
        e2e, "pool", tools=["sleep", tool],
        script=[step(("c1", tool, {}), ("c2", "sleep", {"seconds": 0.05}))],
    )  # fmt: skip

    events = await run_turn(e2e, "pool", "go")

    assert end_reason(events).WhichOneof("kind") == "completed"
    k = kinds(events)
    calls = [i for i, kind in enumerate(k) if kind == "tool_call"]
    results = [i for i, kind in enumerate(k) if kind == "tool_result"]
    assert len(calls) == 2 and len(results) == 2, k
    # Both were dispatched before either committed (an exclusive call is a barrier:
    # the next call would only be logged after its result) ...
    assert max(calls) < min(results), k
    # ... and the results are committed in model order, though `sleep` finished first.
    first, second = (events[i].tool_result for i in results)
    assert (first.call_id, second.call_id) == ("c1", "c2")
    assert text_of(first.content) == f"{tool} done" and not first.is_error
    assert text_of(second.content) == "slept 0.05 seconds" and not second.is_error


@pytest.mark.parametrize("lang", LANGS)
async def test_turn_continuation_forces_one_more_step(
    e2e: E2E, launcher: PluginLauncher, lang: str
) -> None:
    await create_agent(e2e, "again")
    baseline = await run_turn(e2e, "again", "once")
    assert kinds(baseline).count("step_start") == 1

    plugin = await launcher.start(configurable(lang, "--name", f"again-{lang}", "--continue-once"))
    await register(e2e.channel, plugin.address)

    events = await run_turn(e2e, "again", "twice")

    assert end_reason(events).WhichOneof("kind") == "completed"
    steps = of_kind(events, "step_start")
    assert [(s.step_start.turn, s.step_start.step) for s in steps] == [(2, 1), (2, 2)]


@pytest.mark.parametrize("lang", LANGS)
async def test_cancel_during_a_slow_hook_call(
    e2e: E2E, launcher: PluginLauncher, lang: str, tmp_path: Path
) -> None:
    cancel_file = tmp_path / f"cancelled-{lang}.txt"
    plugin = await launcher.start(
        configurable(lang, "--name", f"slow-{lang}", "--slow", str(FOREVER), "--tag", "S",
                     "--cancel-file", str(cancel_file))
    )  # fmt: skip
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "patient")

    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id="patient", text="p"), timeout=T
    )
    with EventStream(e2e.agents, agent_id="patient", from_seq=sent.next_seq) as stream:
        await stream.until("turn_start")

        await wait_call_sent(e2e.channel, plugin.name)
        cancel = await e2e.agents.CancelTurn(
            api.CancelTurnRequest(agent_id="patient", reason="enough"), timeout=T
        )
        assert cancel.cancelled
        # The handler sleeps far longer than this wait: the turn ends without it.
        end = await stream.until("turn_end")

    assert end.turn_end.reason.WhichOneof("kind") == "aborted"
    assert end.turn_end.reason.aborted.reason == "enough"
    assert "user_message" not in kinds(stream.events)
    # The plugin saw the CancelCall: its handler was cancelled mid-sleep, not answered.
    line = await plugin.line()
    assert re.fullmatch(r"cancelled \S+", line), line
    assert cancel_file.read_text().strip() == line


# -- composition -------------------------------------------------------------------------


async def test_two_plugins_on_one_waterfall_compose_in_order(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    a = await launcher.start(
        configurable("python", "--name", "tag-a", "--tag", "A", "--order", "1")
    )
    b = await launcher.start(configurable("node", "--name", "tag-b", "--tag", "B", "--order", "2"))
    await register(e2e.channel, a.address)
    await register(e2e.channel, b.address)
    await create_agent(e2e, "composed")

    events = await run_turn(e2e, "composed", "p")
    assert user_text(events) == "p-A-B"
    assert "p-A-B" in assistant_text(events)

    # Swap the orders with the operator override at registration.
    await unregister(e2e.channel, "tag-a")
    await unregister(e2e.channel, "tag-b")
    a_again = await register(e2e.channel, a.address, order=2)
    b_again = await register(e2e.channel, b.address, order=1)
    assert [s.order for s in a_again.subscriptions] == [2]
    assert [s.order for s in b_again.subscriptions] == [1]

    events = await run_turn(e2e, "composed", "p")
    assert user_text(events) == "p-B-A"


# -- faults ------------------------------------------------------------------------------


async def test_killed_plugin_fails_closed_then_serves_again_after_restart(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    argv = configurable("python", "--name", "victim", "--tag", "K", "--slow", "0.5")
    plugin = await launcher.start(argv)
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "fragile")

    # SIGKILL while the prompt-submit call is in flight.
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id="fragile", text="p"), timeout=T
    )

    await wait_call_sent(e2e.channel, "victim")
    await plugin.kill()
    events = await read_turn(e2e.agents, "fragile", sent.next_seq)
    message = plugin_error(events, "PLUGIN_DISCONNECTED", "victim")
    assert "agent/prompt-submit" in message
    assert kinds(events).count("turn_end") == 1

    # Still registered and down: the FAIL_CLOSED seam fails the next turn too, at once.
    down = await plugin_state(e2e.channel, "victim")
    assert down.state != reg.PLUGIN_STATE_READY
    assert down.last_error
    events = await run_turn(e2e, "fragile", "q")
    plugin_error(events, "PLUGIN_DISCONNECTED", "victim")

    # Restarted on the same port, it is reconnected (with backoff) and used again.
    await launcher.restart(plugin)
    back = await wait_state(e2e.channel, "victim")
    assert back.stats.reconnects >= 1
    events = await run_turn(e2e, "fragile", "r")
    assert end_reason(events).WhichOneof("kind") == "completed"
    assert user_text(events) == "r-K"


async def test_a_plugin_that_never_answers_times_out(e2e: E2E, launcher: PluginLauncher) -> None:
    plugin = await launcher.start(configurable("python", "--name", "mute", "--hang"))
    registered = await register(e2e.channel, plugin.address, deadline=0.5)
    assert registered.subscriptions[0].timeout.ToNanoseconds() == 500_000_000
    await create_agent(e2e, "waiting")

    events = await run_turn(e2e, "waiting", "p")

    message = plugin_error(events, "PLUGIN_TIMEOUT", "mute")
    assert "agent/prompt-submit" in message
    # The deadline that applied is the registration's, not the 5 s default.
    assert "no answer within 0.5 s" in message
    stats = (await plugin_state(e2e.channel, "mute")).stats
    assert stats.timeouts == 1 and stats.errors == 0


async def test_a_malformed_reply_fails_the_turn(e2e: E2E, launcher: PluginLauncher) -> None:
    plugin = await launcher.start(configurable("python", "--name", "garbled", "--malformed"))
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "confused")

    events = await run_turn(e2e, "confused", "p")

    assert "tool_pre_execute" in plugin_error(events, "PLUGIN_MALFORMED", "garbled")
    assert "user_message" not in kinds(events)
    assert (await plugin_state(e2e.channel, "garbled")).stats.errors == 1


async def test_unregister_during_a_call_fails_it_under_the_policy(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(
        configurable("python", "--name", "leaving", "--slow", str(FOREVER))
    )
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "left")
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id="left", text="p"), timeout=T
    )

    await wait_call_sent(e2e.channel, "leaving")
    await unregister(e2e.channel, "leaving")
    # The handler sleeps far longer than this wait: the call failed without its answer.
    events = await read_turn(e2e.agents, "left", sent.next_seq)

    assert "unregistered" in plugin_error(events, "PLUGIN_DISCONNECTED", "leaving")
    # Its stream closed, the plugin cancelled the handler mid-sleep.
    assert re.fullmatch(r"cancelled \S+", await plugin.line())
    # The next turn runs without it.
    assert end_reason(await run_turn(e2e, "left", "q")).WhichOneof("kind") == "completed"


async def test_a_fail_open_plugin_that_is_down_is_skipped_and_counted(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(
        configurable("python", "--name", "optional", "--tag", "X", "--fail-open")
    )
    registered = await register(e2e.channel, plugin.address)
    assert [s.failure_policy for s in registered.subscriptions] == [hk.FAILURE_POLICY_FAIL_OPEN]
    await create_agent(e2e, "resilient")
    assert user_text(await run_turn(e2e, "resilient", "p")) == "p-X"

    await plugin.kill()

    async def down() -> bool:
        return (await plugin_state(e2e.channel, "optional")).state != reg.PLUGIN_STATE_READY

    await eventually(down, "the killed plugin to be shown down")
    events = await run_turn(e2e, "resilient", "q")

    assert end_reason(events).WhichOneof("kind") == "completed"
    assert user_text(events) == "q"
    assert (await plugin_state(e2e.channel, "optional")).stats.fail_opens >= 1


# -- the registry ------------------------------------------------------------------------


async def test_list_plugins_shows_state_subscriptions_counters_and_latencies(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(
        configurable("python", "--name", "busy", "--tag", "L", "--order", "7",
                     "--deny-tool", "echo", "--tool", "busy_tool", "--tool-sleep", "0.01")
    )  # fmt: skip
    await register(e2e.channel, plugin.address)
    await create_agent(
        e2e, "observed", tools=["echo", "busy_tool"],
        script=[step(("t1", "busy_tool", {}), ("t2", "echo", {"text": "x"}))],
    )  # fmt: skip
    events = await run_turn(e2e, "observed", "p")
    assert end_reason(events).WhichOneof("kind") == "completed"
    assert user_text(events) == "p-L"

    listed = await plugin_state(e2e.channel, "busy")
    assert listed.state == reg.PLUGIN_STATE_READY
    assert listed.version == "test"
    assert listed.address == plugin.address
    assert [(s.seam, s.order, s.failure_policy) for s in listed.subscriptions] == [
        (hk.SEAM_PROMPT_SUBMIT, 7, hk.FAILURE_POLICY_FAIL_CLOSED),
        (hk.SEAM_TOOLS_PRE_EXECUTE, 7, hk.FAILURE_POLICY_FAIL_CLOSED),
    ]
    assert [t.name for t in listed.tools] == ["busy_tool"]
    # prompt-submit once, pre-execute per call (twice), the tool once.
    assert listed.stats.calls == 4
    assert (listed.stats.errors, listed.stats.timeouts, listed.stats.fail_opens) == (0, 0, 0)
    latencies = {(lat.kind, lat.seam): lat for lat in listed.latencies}
    prompt = (hk.CALL_KIND_SEAM, hk.SEAM_PROMPT_SUBMIT)
    pre_execute = (hk.CALL_KIND_SEAM, hk.SEAM_TOOLS_PRE_EXECUTE)
    tool = (hk.CALL_KIND_TOOL_EXECUTE, hk.SEAM_UNSPECIFIED)
    assert set(latencies) == {prompt, pre_execute, tool}
    assert latencies[prompt].calls == 1
    assert latencies[pre_execute].calls == 2
    assert latencies[tool].calls == 1
    for latency in latencies.values():
        assert 0 < latency.p50.ToNanoseconds() <= latency.p99.ToNanoseconds()
    # The tool sleeps 10 ms: its latency says so.
    assert latencies[tool].p50.ToNanoseconds() >= 10_000_000

    # Unregistered: no effect any more, and its tool is gone.
    await unregister(e2e.channel, "busy")
    assert await list_plugins(e2e.channel) == {}
    await create_agent(e2e, "after", script=[step(("t3", "busy_tool", {}))])
    events = await run_turn(e2e, "after", "p")
    assert end_reason(events).WhichOneof("kind") == "completed"
    assert user_text(events) == "p"
    (result,) = of_kind(events, "tool_result")
    assert result.tool_result.is_error
    assert "busy_tool" in text_of(result.tool_result.content)
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await unregister(e2e.channel, "busy")
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def refused(e2e: E2E, address: str) -> grpc.aio.AioRpcError:
    """RegisterPlugin of `address`, which must fail; returns the error."""
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await e2e.registry.RegisterPlugin(reg.RegisterPluginRequest(address=address), timeout=T)
    return error.value


async def test_register_an_unreachable_or_empty_address_is_refused(e2e: E2E) -> None:
    unreachable = f"127.0.0.1:{free_port()}"
    error = await refused(e2e, unreachable)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert unreachable in (error.details() or "")

    error = await refused(e2e, "")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "address" in (error.details() or "")

    assert await list_plugins(e2e.channel) == {}


async def test_an_unknown_failure_policy_is_an_invalid_argument(e2e: E2E) -> None:
    request = reg.RegisterPluginRequest(address=f"127.0.0.1:{free_port()}", failure_policy=7)  # type: ignore[arg-type]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await e2e.registry.RegisterPlugin(request, timeout=T)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.value.details() or "").startswith("failure_policy:")
    assert await list_plugins(e2e.channel) == {}


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    """`value` as a Struct, unchecked (it may hold what JSON cannot carry)."""
    result = struct_pb2.Struct()
    result.update(value)
    return result


class Describer(hk_rpc.HookServiceServicer):
    """A plugin that only answers `Describe`, with the description it is given."""

    def __init__(self, description: hk.DescribeResponse) -> None:
        self.description = description

    async def Describe(
        self, request: hk.DescribeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> hk.DescribeResponse:
        return self.description

    async def Handle(
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[hk.HandleResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this plugin only describes itself")
        yield hk.HandleResponse()  # unreachable: makes this an async generator


@pytest.mark.parametrize(
    "bad",
    [
        hk.Subscription(seam=14),  # type: ignore[arg-type]  # was SEAM_MODEL_STREAM
        hk.Subscription(seam=42),  # type: ignore[arg-type]
        hk.Subscription(seam=hk.SEAM_PRE_STEP, timeout=duration_pb2.Duration()),
        hk.ToolDefinition(name="nan_tool", input_schema=struct({"maximum": float("nan")})),
    ],
    ids=["reserved-seam", "unknown-seam", "zero-timeout", "nan-schema"],
)
async def test_an_invalid_description_is_failed_precondition_and_leaves_nothing(
    e2e: E2E, bad: hk.Subscription | hk.ToolDefinition
) -> None:
    description = hk.DescribeResponse(
        name="half", version="1", subscriptions=[hk.Subscription(seam=hk.SEAM_PROMPT_SUBMIT)]
    )
    if isinstance(bad, hk.Subscription):
        description.subscriptions.append(bad)
    else:
        description.tools.append(bad)
    server = grpc.aio.server()
    hk_rpc.add_HookServiceServicer_to_server(Describer(description), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        error = await refused(e2e, f"127.0.0.1:{port}")
    finally:
        await server.stop(0)

    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "describes itself invalidly" in (error.details() or "")
    assert await list_plugins(e2e.channel) == {}
    # No listener was left behind: a prompt goes through untouched.
    await create_agent(e2e, "untouched")
    assert user_text(await run_turn(e2e, "untouched", "p")) == "p"


@pytest.mark.parametrize(
    "kind",
    [
        "subscriptions-only",
        # A plugin providing a tool: its second registration must also be ALREADY_EXISTS
        # (the contract: "A name already registered gives ALREADY_EXISTS"), not the
        # FAILED_PRECONDITION "tool is already provided" that its own first
        # registration's tool would cause.
        "with-a-tool",
    ],
)
async def test_register_the_same_plugin_twice_is_already_exists(
    e2e: E2E, launcher: PluginLauncher, kind: str
) -> None:
    if kind == "with-a-tool":
        plugin = await launcher.start(guard_example("python"))
    else:
        plugin = await launcher.start(configurable("python", "--name", "guard", "--tag", "G"))
    await register(e2e.channel, plugin.address)

    error = await refused(e2e, plugin.address)

    assert error.code() == grpc.StatusCode.ALREADY_EXISTS, error.details()
    assert '"guard"' in (error.details() or "")
    assert list(await list_plugins(e2e.channel)) == ["guard"]


# -- config plugins ----------------------------------------------------------------------


async def test_config_plugins_are_connected_at_start(launcher: PluginLauncher) -> None:
    plugin = await launcher.start(configurable("node", "--name", "from-config", "--tag", "C"))
    late_port = free_port()
    config = Config(
        listen="127.0.0.1:0",
        store="memory",
        plugins=(
            PluginConfig(address=plugin.address, order=3, failure_policy="fail_open"),
            # Nothing listens there yet: retried in the background. Not required, so
            # turns run without it meanwhile.
            PluginConfig(address=f"127.0.0.1:{late_port}", required=False),
        ),
    )
    async with running_app(config) as e2e:
        listed = await plugin_state(e2e.channel, "from-config")
        assert listed.state == reg.PLUGIN_STATE_READY
        assert [(s.order, s.failure_policy) for s in listed.subscriptions] == [
            (3, hk.FAILURE_POLICY_FAIL_OPEN)
        ]
        await create_agent(e2e, "configured")
        assert user_text(await run_turn(e2e, "configured", "p")) == "p-C"

        # The plugin that was not up at start is registered once it is.
        await launcher.start(
            configurable("python", "--name", "late", "--tag", "L", "--order", "5"),
            listen=f"127.0.0.1:{late_port}",
        )
        await wait_state(e2e.channel, "late")
        assert user_text(await run_turn(e2e, "configured", "p")) == "p-C-L"
