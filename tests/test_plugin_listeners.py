"""Remote listeners over a fake transport: agent filters, default deadlines, fail-open counts."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import stream_pb2 as st
from server.core.abort import AbortSignal
from server.plugins.calls import NoticeSlot, PluginCallFailed, PluginStats
from server.plugins.install import install
from tests.harness import Harness, reason_kinds, text_step


class FakeCaller:
    """A `PluginCaller` that records calls and answers with a fixed result or failure."""

    def __init__(self, result: hk.HookResult | None = None, fail: str = "") -> None:
        self.calls: list[hk.HookCall] = []
        self.result = result or hk.HookResult()
        self.fail = fail

    async def call(self, call: hk.HookCall, seconds: float, signal: AbortSignal) -> hk.HookResult:
        self.calls.append(call)
        if self.fail:
            raise PluginCallFailed(self.fail, "the fake plugin failed")
        answer = hk.HookResult()
        answer.CopyFrom(self.result)
        answer.call_id = call.call_id
        return answer

    async def stream(
        self, call: hk.HookCall, seconds: float, signal: AbortSignal
    ) -> AsyncGenerator[st.StreamChunk, None]:
        raise PluginCallFailed("error", "no models here")
        yield st.StreamChunk()  # pragma: no cover - makes this an async generator

    def admit(self, slot: NoticeSlot) -> bool:
        return True

    def notify(self, call: hk.HookCall, slot: NoticeSlot) -> None:
        self.calls.append(call)


def subscribe(harness: Harness, caller: FakeCaller, **subscription: object) -> PluginStats:
    stats = PluginStats()
    install(
        "fake",
        [hk.Subscription(seam=hk.SEAM_PROMPT_SUBMIT, **subscription)],  # type: ignore[arg-type]
        [],
        caller,
        stats,
        harness.runtime.seams,
        harness.runtime.tools,
        lambda agent_id: f"{agent_id}-session",
        default_timeout=2.5,
    )
    return stats


BLOCK = hk.HookResult(prompt_submit=d.PromptDecision(block=d.PromptBlock(reason="filtered")))


async def test_an_agent_filter_keeps_the_listener_to_the_agents_it_names(harness: Harness) -> None:
    caller = FakeCaller(BLOCK)
    subscribe(harness, caller, agent_ids=["a1"])
    named = await harness.create("a1", script=[text_step("x")])
    other = await harness.create("a2", script=[text_step("x")])
    await harness.turn(named, "hi")
    await harness.turn(other, "hi")
    assert reason_kinds(named) == ["rejected"]
    assert reason_kinds(other) == ["completed"]
    assert [c.agent_id for c in caller.calls] == ["a1"]
    assert caller.calls[0].session_id == "a1-session"


async def test_a_subscription_without_timeout_gets_the_server_default(harness: Harness) -> None:
    caller = FakeCaller()
    subscribe(harness, caller)
    agent = await harness.create(script=[text_step("x")])
    await harness.turn(agent, "hi")
    assert caller.calls[0].timeout.ToNanoseconds() == 2_500_000_000


async def test_fail_open_skips_and_counts_fail_closed_fails_the_turn(harness: Harness) -> None:
    open_stats = subscribe(
        harness, FakeCaller(fail="timeout"), failure_policy=hk.FAILURE_POLICY_FAIL_OPEN
    )
    agent = await harness.create(script=[text_step("x"), text_step("y")])
    await harness.turn(agent, "hi")
    assert reason_kinds(agent) == ["completed"]
    assert open_stats.fail_opens == 1
    subscribe(harness, FakeCaller(fail="disconnected"))
    await harness.turn(agent, "again")
    error = [e.turn_end.reason for e in agent.session.events if e.HasField("turn_end")][-1].error
    assert error.code == "PLUGIN_DISCONNECTED"
    assert error.message.startswith('plugin "fake" failed at agent/prompt-submit')


async def test_event_kinds_limit_the_session_events_a_plugin_is_sent(harness: Harness) -> None:
    caller = FakeCaller()
    install(
        "watcher",
        [hk.Subscription(seam=hk.SEAM_SESSION_EVENTS, event_kinds=["turn_end"])],
        [],
        caller,
        PluginStats(),
        harness.runtime.seams,
        harness.runtime.tools,
        lambda agent_id: "",
    )
    agent = await harness.create(script=[text_step("x")])
    await harness.turn(agent, "hi")
    sent = [c.session_event.event.WhichOneof("payload") for c in caller.calls]
    assert sent == ["turn_end"]
