"""Watched seams (`Subscription.observe_only`): a plugin that only watches a transforming
seam or checkpoint gets each of its calls as a notification, in the loop's order, and
the loop never waits for it; what its handler returns changes nothing.

The plugins are the Python helper on real ports; the server is a real `App` with the
scripted model (a tool step, then a text step).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentloop.plugin import sdk
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import agent_pb2
from agentloop.v1 import content_pb2 as c
from server.edge.app import App
from server.kernel.errors import FailedPrecondition
from server.plugins.registry import Overrides
from server.settings.config import Config
from tests.plugin_client import HandleStream, hook_client, serving

T = 5.0
"""A hang guard, never a measured time."""

PROMPT = [c.ContentBlock(text=c.TextBlock(text="count the words of this short prompt"))]
OPTIONS = agent_pb2.AgentOptions(provider="scripted", model="m", tools=["word_count"])

SEAMS = (
    "prompt_submit", "session_prefix", "pre_step", "request", "step_result",
    "turn_continuation", "turn_stop", "tools_pre_execute", "tools_post_execute",
)  # fmt: skip
"""The SDK's registration methods of every transforming seam and checkpoint."""

CHANGES: dict[str, Any] = {
    "prompt_submit": sdk.block_prompt("blocked by a watcher"),
    "pre_step": sdk.add_context("a watcher's context"),
    "turn_continuation": sdk.stop_turn(),
    "turn_stop": sdk.terminal_stop(),
    "tools_pre_execute": sdk.deny("denied by a watcher"),
}
"""Decisions that would change the turn, were they heeded."""


class Watcher:
    """Subscribes to every seam; records each call as it arrives (payload, kind, turn, step)."""

    def __init__(self, observe_only: bool, answer: bool, changes: bool = False) -> None:
        self.plugin = sdk.Plugin("watcher")
        self.answer = answer
        self.changes = changes
        """Handlers return `CHANGES` rather than None."""
        self.seen: list[tuple[str, int, int, int]] = []
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()
        """Handlers of a watcher that does not answer wait for it (never set in a turn)."""
        for name in SEAMS:
            getattr(self.plugin, name)(observe_only=observe_only, timeout=T)(self.handler(name))

    def handler(self, name: str) -> Any:
        async def handle(call: hk.HookCall) -> Any:
            self.seen.append((str(call.WhichOneof("payload")), call.kind, call.turn, call.step))
            self.arrived.set()
            if not self.answer:
                await self.release.wait()
            return CHANGES.get(name) if self.changes else None

        return handle


async def run_turn(plugin: sdk.Plugin | None) -> tuple[list[str], str]:
    """One turn with `plugin` registered (or none): its event kinds and its end reason."""
    app = App(Config(listen="127.0.0.1:0", store="memory"))
    await app.start()
    try:
        if plugin is not None:
            async with serving(plugin) as address:
                await app.plugins.register(address, Overrides())
                return await turn_of(app)
        return await turn_of(app)
    finally:
        await app.stop(grace=1)


async def turn_of(app: App) -> tuple[list[str], str]:
    agent = await app.factory.create("a", OPTIONS)
    agent.send(PROMPT)
    async with asyncio.timeout(T):
        await agent.when_idle()
    kinds = [str(event.WhichOneof("payload")) for event in agent.session.events]
    end = str(agent.session.events[-1].turn_end.reason.WhichOneof("kind"))
    return kinds, end


async def test_a_watched_seam_is_a_notification_the_loop_never_waits_for() -> None:
    answering = Watcher(observe_only=False, answer=True)
    expected_kinds, _ = await run_turn(None)
    assert "tool_result" in expected_kinds  # the workload: a tool step, then a text step
    with_answers, end = await run_turn(answering.plugin)
    assert with_answers == expected_kinds and end == "completed"

    # Its handlers never return, and would change the turn if they did: the turn runs as
    # without the plugin (a wait would fail it: FAIL_CLOSED, at the timeout).
    watcher = Watcher(observe_only=True, answer=False, changes=True)
    app = App(Config(listen="127.0.0.1:0", store="memory"))
    await app.start()
    try:
        async with serving(watcher.plugin) as address:
            await app.plugins.register(address, Overrides())
            kinds, end = await turn_of(app)
            assert kinds == expected_kinds and end == "completed"
            async with asyncio.timeout(T):
                while len(watcher.seen) < len(answering.seen):
                    watcher.arrived.clear()
                    await watcher.arrived.wait()
            watcher.release.set()
        stats = app.plugins.plugins["watcher"].stats
        assert stats.calls == 0 and stats.timeouts == 0 and stats.dropped == 0
    finally:
        await app.stop(grace=1)
    # The same calls, in the same order, with the same turn and step: as notifications.
    assert [(p, t, s) for p, _, t, s in watcher.seen] == [
        (p, t, s) for p, _, t, s in answering.seen
    ]
    assert {kind for _, kind, _, _ in answering.seen} == {hk.CALL_KIND_SEAM}
    assert {kind for _, kind, _, _ in watcher.seen} == {hk.CALL_KIND_NOTIFICATION}
    assert [p for p, *_ in watcher.seen].count("pre_step") == 2  # one per step


async def test_an_approver_cannot_only_watch() -> None:
    plugin = sdk.Plugin("watcher")

    @plugin.tools_approval(observe_only=True)
    async def approve(call: hk.HookCall) -> None:
        return None

    app = App(Config(listen="127.0.0.1:0", store="memory"))
    await app.start()
    try:
        async with serving(plugin) as address:
            refused = "SEAM_TOOLS_APPROVAL cannot be observe_only"
            with pytest.raises(FailedPrecondition, match=refused):
                await app.plugins.register(address, Overrides())
    finally:
        await app.stop(grace=1)


async def test_the_python_helper_answers_a_watched_seam_sent_as_a_call_unchanged() -> None:
    """A server that does not know `observe_only` sends calls: "continue unchanged"."""
    plugin = sdk.Plugin("watcher")
    seen: list[int] = []

    @plugin.turn_stop(observe_only=True)
    async def stop(call: hk.HookCall) -> hk.TurnStopResult:
        seen.append(call.kind)
        return sdk.terminal_stop()  # ignored: the plugin only watches

    @plugin.pre_step(observe_only=True)
    async def fails(call: hk.HookCall) -> None:
        seen.append(call.kind)
        raise RuntimeError("a watcher's failure is contained")

    async with hook_client(plugin) as stub:
        description = await stub.Describe(hk.DescribeRequest(), timeout=T)
        assert [s.observe_only for s in description.subscriptions] == [True, True]
        stream = HandleStream(stub)
        call = hk.HookCall(call_id="s", kind=hk.CALL_KIND_SEAM, seam=hk.SEAM_TURN_STOP)
        call.turn_stop.SetInParent()
        failing = hk.HookCall(call_id="p", kind=hk.CALL_KIND_SEAM, seam=hk.SEAM_PRE_STEP)
        failing.pre_step.SetInParent()
        note = hk.HookCall(call_id="n", kind=hk.CALL_KIND_NOTIFICATION, seam=hk.SEAM_TURN_STOP)
        note.turn_stop.SetInParent()
        await stream.send(note, call)
        answer = await stream.result()
        assert answer == hk.HookResult(call_id="s")  # the notification got none
        await stream.send(failing)
        assert await stream.result() == hk.HookResult(call_id="p")
        assert await stream.finish() == []
    assert seen == [hk.CALL_KIND_NOTIFICATION, hk.CALL_KIND_SEAM, hk.CALL_KIND_SEAM]
