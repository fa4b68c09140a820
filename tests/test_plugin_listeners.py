"""Remote listeners over a fake transport: agent filters, default deadlines, fail-open counts."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import agent_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.kernel.abort import AbortSignal
from server.kernel.content import plain_text
from server.models.scripted_options import script_options
from server.plugins.calls import NoticeSlot, PluginCallFailed, PluginStats
from server.plugins.event_notes import event_call
from server.plugins.install import install
from tests.harness import Harness, kinds, reason_kinds, text_block, text_step, tool_step


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
        self,
        call: hk.HookCall,
        seconds: float,
        signal: AbortSignal,
        messages: Sequence[bytes | bytearray] | None = None,
    ) -> AsyncGenerator[st.StreamChunk, None]:
        raise PluginCallFailed("error", "no models here")
        yield st.StreamChunk()  # pragma: no cover - makes this an async generator

    def admit(self, slot: NoticeSlot) -> bool:
        return True

    def notify(self, call: hk.HookCall, slot: NoticeSlot) -> None:
        self.calls.append(call)

    def offer_event(self, head: bytes, event: ev.SessionEvent, slot: NoticeSlot) -> None:
        self.calls.append(event_call(head, event))

    def offer_events(
        self, head: bytes, events: Sequence[ev.SessionEvent], slot: NoticeSlot
    ) -> None:
        self.calls.extend(event_call(head, event) for event in events)


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


def watch(
    harness: Harness, plugin: str, caller: FakeCaller, session: list[str], agent: list[str],
    agent_ids: Sequence[str] = (),
) -> PluginStats:  # fmt: skip
    """A plugin observing the session events of kinds `session` and the agent events of
    kinds `agent` (empty: every kind), of the agents `agent_ids` (empty: every agent)."""
    stats = PluginStats()
    install(
        plugin,
        [
            hk.Subscription(
                seam=seam, agent_ids=agent_ids, conditions=hk.MatchConditions(event_kinds=kinds)
            )
            for seam, kinds in ((hk.SEAM_SESSION_EVENTS, session), (hk.SEAM_AGENT_EVENTS, agent))
        ],
        [],
        caller,
        stats,
        harness.runtime.seams,
        harness.runtime.tools,
        lambda agent_id: "",
    )
    return stats


def observed(calls: Sequence[hk.HookCall], agent_id: str) -> tuple[list[str], list[str]]:
    """The session and the agent event kinds of `agent_id` among `calls`, in order."""
    mine = [call for call in calls if call.agent_id == agent_id]
    return (
        [call.session_event.event.WhichOneof("payload") or "" for call in mine
         if call.HasField("session_event")],
        [call.agent_event.event.WhichOneof("event") or "" for call in mine
         if call.HasField("agent_event")],
    )  # fmt: skip


async def test_event_kinds_decided_ahead_count_each_skip_and_send_each_kind_wanted(
    harness: Harness,
) -> None:
    """Kinds no observer of an agent wants are passed by unread (a stored run holding none
    of them, an agent event of such a kind) and still counted, one skip per event; the
    kinds wanted are sent, in order. Checked against an observer sent every event, the
    observers changing between two turns."""
    everything, few = FakeCaller(), FakeCaller()
    reference = watch(harness, "everything", everything, [], [], agent_ids=["a1"])
    step = tool_step(("word_count", '{"text": "a b"}'))
    options = agent_pb2.AgentOptions(
        provider="scripted", model="m", tools=["word_count"],
        provider_options=script_options([step, text_step("done"), step, text_step("again")]),
    )  # fmt: skip
    # No live subscriber: the agent events go to the observers alone, routed by kind.
    a1 = await harness.factory.create("a1", options)
    a2 = await harness.factory.create("a2", options)
    for agent in (a1, a2):
        await harness.turn(agent, "first")
    await harness.runtime.journal.drain()
    before = len(everything.calls)
    wanted = {"tool_call", "turn_end", "status"}
    stats = watch(harness, "few", few, ["tool_call", "turn_end"], ["status"])
    for agent in (a1, a2):
        await harness.turn(agent, "second")
    await harness.runtime.journal.drain()

    sessions, agents = observed(everything.calls, "a1")
    later_sessions, later_agents = observed(everything.calls[before:], "a1")
    assert observed(everything.calls, "a2") == ([], [])  # a2's all skipped, by agent
    assert {"assistant_chunk", "tool_call", "turn_end"} <= set(later_sessions)
    assert {"queued", "status"} <= set(later_agents)
    for agent_id in ("a1", "a2"):  # a2's turns are a1's, event for event
        assert observed(few.calls, agent_id) == (
            [kind for kind in later_sessions if kind in wanted],
            [kind for kind in later_agents if kind in wanted],
        )
    assert reference.skipped[hk.SEAM_SESSION_EVENTS] == len(sessions)
    assert reference.skipped[hk.SEAM_AGENT_EVENTS] == len(agents)
    assert stats.skipped[hk.SEAM_SESSION_EVENTS] == 2 * sum(
        kind not in wanted for kind in later_sessions
    )
    assert stats.skipped[hk.SEAM_AGENT_EVENTS] == 2 * sum(
        kind not in wanted for kind in later_agents
    )


# -- every seam's decision, applied by the generic adapter ------------------------------


class SeamAnswers(FakeCaller):
    """Answers each seam's call with its own result (unset: "continue unchanged")."""

    def __init__(self, answers: dict[hk.Seam.ValueType, hk.HookResult]) -> None:
        super().__init__()
        self.answers = answers

    async def call(self, call: hk.HookCall, seconds: float, signal: AbortSignal) -> hk.HookResult:
        self.calls.append(call)
        answer = hk.HookResult()
        answer.CopyFrom(self.answers.get(call.seam, hk.HookResult()))
        answer.call_id = call.call_id
        return answer


def serve(harness: Harness, answers: dict[hk.Seam.ValueType, hk.HookResult]) -> SeamAnswers:
    caller = SeamAnswers(answers)
    install(
        "fake",
        [hk.Subscription(seam=seam) for seam in answers],
        [],
        caller,
        PluginStats(),
        harness.runtime.seams,
        harness.runtime.tools,
        lambda agent_id: "",
    )
    return caller


def payloads(caller: FakeCaller) -> list[tuple[int, int, int, str | None]]:
    return [(c.seam, c.turn, c.step, c.WhichOneof("payload")) for c in caller.calls]


async def test_request_and_step_result_decisions_replace_what_the_loop_uses(
    harness: Harness,
) -> None:
    replaced = c.Message(role=c.ROLE_ASSISTANT, content=[text_block("from the plugin")])
    caller = serve(harness, {
        hk.SEAM_REQUEST: hk.HookResult(request=hk.RequestResult(
            config=c.ModelConfig(provider="scripted", model="chosen"))),
        hk.SEAM_STEP_RESULT: hk.HookResult(step_result=hk.StepResultResult(message=replaced)),
    })  # fmt: skip
    agent = await harness.create(script=[text_step("original")])
    await harness.turn(agent, "hi")
    assert harness.model.requests[0].header.config.model == "chosen"
    message = next(e for e in agent.session.events if e.HasField("assistant_message"))
    assert plain_text(message.assistant_message.content) == "from the plugin"
    assert payloads(caller) == [
        (hk.SEAM_REQUEST, 1, 1, "request"), (hk.SEAM_STEP_RESULT, 1, 1, "step_result"),
    ]  # fmt: skip
    assert caller.calls[1].step_result.message.content[0].text.text == "original"


async def test_session_prefix_and_pre_step_decisions_reach_the_request(harness: Harness) -> None:
    prefix = c.Message(role=c.ROLE_USER, content=[text_block("PREFIX")])
    note = d.HookContext(content=[text_block("pre-step note")])
    caller = serve(harness, {
        hk.SEAM_SESSION_PREFIX: hk.HookResult(
            session_prefix=hk.SessionPrefixResult(prefix=[prefix])),
        hk.SEAM_PRE_STEP: hk.HookResult(pre_step=hk.PreStepResult(contexts=[note])),
    })  # fmt: skip
    agent = await harness.create(script=[text_step("ok")])
    await harness.turn(agent, "hi")
    messages = harness.model.requests[0].messages
    assert plain_text(messages[0].content) == "PREFIX"
    assert "pre-step note" in plain_text(messages[-1].content)
    # The pre-step call carries the prefix the plugin composed, and the system prompt.
    pre_step = next(c.pre_step for c in caller.calls if c.seam == hk.SEAM_PRE_STEP)
    assert [plain_text(m.content) for m in pre_step.prefix] == ["PREFIX"]
    assert pre_step.system == harness.model.requests[0].header.system


async def test_turn_continuation_and_turn_stop_decisions(harness: Harness) -> None:
    caller = serve(harness, {
        hk.SEAM_TURN_CONTINUATION: hk.HookResult(turn_continuation=d.ContinuationDecision(
            continue_turn=d.ContinuationContinue())),
        hk.SEAM_TURN_STOP: hk.HookResult(turn_stop=hk.TurnStopResult(stop=True)),
    })  # fmt: skip
    agent = await harness.create(script=[text_step("one"), text_step("two")])
    await harness.turn(agent, "hi")
    # Continue was asked for, but the terminal stop wins: one step.
    assert kinds(agent).count("step_start") == 1
    assert [p[0] for p in payloads(caller)] == [hk.SEAM_TURN_CONTINUATION, hk.SEAM_TURN_STOP]
    continuation = caller.calls[0].turn_continuation.decision
    assert continuation.WhichOneof("decision") == "stop"  # the loop's default, no tool call


async def test_tool_decisions_deny_and_rewrite(harness: Harness) -> None:
    caller = serve(harness, {
        hk.SEAM_TOOLS_PRE_EXECUTE: hk.HookResult(tool_pre_execute=d.PreToolDecision(
            deny=d.ToolDeny(reason="not this one"))),
    })  # fmt: skip
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text": "a b"}')), text_step("ok")],
        tools=["word_count"],
    )
    await harness.turn(agent, "count")
    result = next(e.tool_result for e in agent.session.events if e.HasField("tool_result"))
    assert plain_text(result.content) == "Error: not this one" and result.is_error
    assert caller.calls[0].tool_pre_execute.invocation.name == "word_count"


async def test_a_post_execute_rewrite_is_the_result(harness: Harness) -> None:
    caller = serve(harness, {
        hk.SEAM_TOOLS_POST_EXECUTE: hk.HookResult(tool_post_execute=d.PostToolDecision(
            accept=d.ToolAccept(content=[text_block("rewritten")]))),
    })  # fmt: skip
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text": "a b"}')), text_step("ok")],
        tools=["word_count"],
    )
    await harness.turn(agent, "count")
    result = next(e.tool_result for e in agent.session.events if e.HasField("tool_result"))
    assert plain_text(result.content) == "rewritten"
    assert plain_text(list(caller.calls[0].tool_post_execute.output.content)) == "2 words"
