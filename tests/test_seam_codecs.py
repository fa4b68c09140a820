"""The typed seam codecs: each fills the payload field the seam table names, with the
input's values, and reads the decision from the outcome field it names; a waterfall
says which listener made its result (who asked for an approval)."""

from __future__ import annotations

from collections.abc import Awaitable

import pytest

from agentloop.plugin.seam_table import SPECS
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import approval_pb2 as ap
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from server.kernel import seams as S
from server.kernel.abort import NEVER
from server.kernel.authored import authored_waterfall
from server.kernel.content import text_content
from server.kernel.seams import Next, SeamRegistry
from server.kernel.tools import ToolExecution, ToolOutcome
from server.plugins import modes
from server.plugins.codecs import CODECS


class Agent:
    """A seam agent that keeps what is injected."""

    agent_id = "a1"

    def __init__(self) -> None:
        self.injected: list[d.HookContext] = []

    def inject(self, context: d.HookContext, request_id: str = "") -> None:
        self.injected.append(context)


AGENT = Agent()
PROMPT = text_content("hello")
SOURCE = c.Source(kind="user", name="u1")
MESSAGE = c.Message(role=c.ROLE_ASSISTANT, content=text_content("hi"))
CONFIG = c.ModelConfig(model="m1")
EXEC = ToolExecution.of(
    c.ToolCallBlock(id="t1", name="echo", arguments='{"text": "x"}'),
    agent_id="a1", turn=2, step=3, signal=NEVER,
)  # fmt: skip
INVOCATION = hk.ToolInvocation(call_id="t1", name="echo", arguments='{"text": "x"}')
OUTCOME = ToolOutcome(text_content("x"))
REQUEST = ap.ApprovalRequested(approval_id="ap-1", call_id="t1", tool_name="echo", turn=2)
SESSION_EVENT = ev.SessionEvent(seq=7)
AGENT_EVENT = ae.AgentEvent()
CONTINUE = d.ContinuationDecision(stop=d.ContinuationStop())


def at(turn: int = 2, step: int = 0) -> dict[str, object]:
    return {"agent": AGENT, "turn": turn, "step": step, "signal": NEVER}


SAMPLES: dict[str, tuple[object, hk.HookCall]] = {
    "agent/prompt-submit": (
        S.PromptSubmit(**at(), content=PROMPT, source=SOURCE),  # type: ignore[arg-type]
        hk.HookCall(prompt_submit=hk.PromptSubmitCall(content=PROMPT, source=SOURCE)),
    ),
    "agent/session-prefix": (
        [MESSAGE],
        hk.HookCall(session_prefix=hk.SessionPrefixCall(prefix=[MESSAGE])),
    ),
    "agent/pre-step": (
        S.PreStep(**at(step=1), system="be brief", prefix=[MESSAGE]),  # type: ignore[arg-type]
        hk.HookCall(pre_step=hk.PreStepCall(system="be brief", prefix=[MESSAGE])),
    ),
    "agent/request": (
        S.Request(**at(step=1), config=CONFIG),  # type: ignore[arg-type]
        hk.HookCall(request=hk.RequestCall(config=CONFIG)),
    ),
    "agent/step-result": (
        S.StepResult(**at(step=1), message=MESSAGE),  # type: ignore[arg-type]
        hk.HookCall(step_result=hk.StepResultCall(message=MESSAGE)),
    ),
    "agent/turn-continuation": (
        S.TurnContinuation(**at(), decision=CONTINUE),  # type: ignore[arg-type]
        hk.HookCall(turn_continuation=hk.TurnContinuationCall(decision=CONTINUE)),
    ),
    "agent/turn-stop": (
        S.TurnStop(**at()),  # type: ignore[arg-type]
        hk.HookCall(turn_stop=hk.TurnStopCall()),
    ),
    "agent/compact": (
        S.Compact(
            **at(),  # type: ignore[arg-type]
            messages=[MESSAGE],
            instructions="keep the numbers",
            trigger=ev.COMPACTION_TRIGGER_MANUAL,
            tokens_before=1234,
            summary="so far",
        ),
        hk.HookCall(
            compact=hk.CompactCall(
                messages=[MESSAGE],
                instructions="keep the numbers",
                trigger=ev.COMPACTION_TRIGGER_MANUAL,
                tokens_before=1234,
                summary="so far",
            )
        ),
    ),
    "tools/pre-execute": (
        EXEC,
        hk.HookCall(tool_pre_execute=hk.ToolPreExecuteCall(invocation=INVOCATION)),
    ),
    "tools/post-execute": (
        S.ToolCallResult(EXEC, OUTCOME),
        hk.HookCall(
            tool_post_execute=hk.ToolPostExecuteCall(
                invocation=INVOCATION, output=hk.ToolOutput(content=OUTCOME.content)
            )
        ),
    ),
    "session/committed": (
        S.SessionEventSeen(AGENT, SESSION_EVENT),
        hk.HookCall(session_event=hk.SessionEventNotice(event=SESSION_EVENT)),
    ),
    "agent/event": (
        S.AgentEventSeen(AGENT, AGENT_EVENT),
        hk.HookCall(agent_event=hk.AgentEventNotice(event=AGENT_EVENT)),
    ),
    "tools/result-committed": (
        S.ToolCallResult(EXEC, OUTCOME),
        hk.HookCall(
            tool_result=hk.ToolResultNotice(
                invocation=INVOCATION, output=hk.ToolOutput(content=OUTCOME.content)
            )
        ),
    ),
    "tools/approval": (
        S.ApprovalAsk("a1", REQUEST, NEVER),
        hk.HookCall(tool_approval=hk.ToolApprovalCall(approval=REQUEST)),
    ),
}
"""Per seam path: a typed input, and the call its payload must make."""


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.path)
def test_each_codec_fills_the_payload_field_of_its_seam_with_the_input(spec: object) -> None:
    assert isinstance(spec, type(SPECS[0]))
    codec = CODECS[spec.path]
    assert isinstance(
        codec, modes.Transform | modes.Wrap | modes.Check | modes.Watch | modes.Approve
    )
    input, expected = SAMPLES[spec.path]
    call = hk.HookCall()
    codec.fill(input, call)  # type: ignore[arg-type]  # the sample of its seam
    assert call.WhichOneof("payload") == spec.payload
    assert call == expected
    # the wire bytes too: what the plugin parses
    assert call.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )


@pytest.mark.parametrize(
    "spec", [s for s in SPECS if s.decision is not None], ids=lambda spec: spec.path
)
def test_each_codec_reads_the_decision_from_the_outcome_field_of_its_seam(spec: object) -> None:
    assert isinstance(spec, type(SPECS[0])) and spec.decision is not None
    codec = CODECS[spec.path]
    assert not isinstance(codec, modes.Watch)
    assert isinstance(codec, modes.Transform | modes.Wrap | modes.Check | modes.Approve)
    result = hk.HookResult()
    getattr(result, spec.payload).SetInParent()
    decision = codec.read(result)
    assert isinstance(decision, spec.decision)
    assert decision is getattr(result, spec.payload) or decision == getattr(result, spec.payload)


def test_an_approvers_decision_is_answered_as_decision_and_reason() -> None:
    codec = CODECS["tools/approval"]
    assert isinstance(codec, modes.Approve)
    mine = hk.ToolApprovalResult(decision=ap.APPROVAL_DECISION_REJECT, reason="no")
    assert codec.answer(mine) == (ap.APPROVAL_DECISION_REJECT, "no")


# -- who made a waterfall's result ------------------------------------------------------

PRE = S.TOOLS_PRE_EXECUTE
PreNext = Next[ToolExecution, d.PreToolDecision]


def asks(reason: str) -> d.PreToolDecision:
    return d.PreToolDecision(ask=d.ToolAsk(reason=reason))


async def test_without_listeners_nothing_is_built_and_nobody_decided() -> None:
    built: list[int] = []
    default = d.PreToolDecision()

    def build() -> ToolExecution:
        built.append(1)
        return EXEC

    value, author = await authored_waterfall(SeamRegistry(), PRE, "a1", build, default)
    assert (value, author, built) == (default, None, [])


async def test_the_author_is_the_listener_whose_value_the_chain_returned() -> None:
    seams = SeamRegistry()
    mine = asks("inner")

    async def inner(exec: ToolExecution, next_: PreNext) -> d.PreToolDecision:
        return mine

    async def passes_on(exec: ToolExecution, next_: PreNext) -> d.PreToolDecision:
        return await next_()

    seams.on(PRE, passes_on, order=1, name="outer")
    seams.on(PRE, inner, order=2, name="gate", origin="plugin:gate")
    value, author = await authored_waterfall(seams, PRE, "a1", lambda: EXEC, d.PreToolDecision())
    assert value is mine
    assert author is not None and (author.name, author.origin) == ("gate", "plugin:gate")


async def test_an_equal_value_of_its_own_makes_the_outer_listener_the_author() -> None:
    seams = SeamRegistry()

    async def inner(exec: ToolExecution, next_: PreNext) -> d.PreToolDecision:
        return asks("same")

    async def replaces(exec: ToolExecution, next_: PreNext) -> d.PreToolDecision:
        await next_()
        return asks("same")  # equal, but its own

    seams.on(PRE, replaces, order=1, name="outer")
    seams.on(PRE, inner, order=2, name="gate", origin="plugin:gate")
    value, author = await authored_waterfall(seams, PRE, "a1", lambda: EXEC, d.PreToolDecision())
    assert value == asks("same")
    assert author is not None and (author.name, author.origin) == ("outer", "")


async def test_the_default_passed_through_every_listener_has_no_author() -> None:
    seams = SeamRegistry()
    default = d.PreToolDecision()

    def passes_on(exec: ToolExecution, next_: PreNext) -> Awaitable[d.PreToolDecision]:
        return next_()

    seams.on(PRE, passes_on, name="one")
    seams.on(PRE, passes_on, name="two")
    value, author = await authored_waterfall(seams, PRE, "a1", lambda: EXEC, default)
    assert value is default and author is None
    assert await seams.waterfall(PRE, "a1", lambda: EXEC, default) is default
