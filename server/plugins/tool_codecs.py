"""The codecs of the tool seams: pre-execute, post-execute, and the approver.

Per seam, field by field and checked by mypy: `fill` writes the seam's input into its
`HookCall` payload message, `read` takes the decision from its `HookResult` outcome
field, and the apply function says what the decision does. Who asked for an approval
is not written anywhere here: a pre-execute `ask` is returned as the listener's own
decision, and the pipeline names the listener that made it (`Registration.origin`).
"""

from __future__ import annotations

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from server.kernel import seams as S
from server.kernel.seams import Next
from server.kernel.tools import ToolExecution, ToolOutcome
from server.plugins.calls import invocation, tool_output
from server.plugins.conditions import Facets
from server.plugins.modes import Approve, Codec, Transform
from server.plugins.rewrites import compose

# -- tools/pre-execute: allow, deny or ask before a call runs ---------------------------


def _fill_tool_pre_execute(exec: ToolExecution, call: hk.HookCall) -> None:
    call.tool_pre_execute.invocation.CopyFrom(invocation(exec))


def _read_tool_pre_execute(result: hk.HookResult) -> d.PreToolDecision:
    return result.tool_pre_execute


async def _apply_tool_pre_execute(
    exec: ToolExecution, mine: d.PreToolDecision, next_: Next[ToolExecution, d.PreToolDecision]
) -> d.PreToolDecision:
    kind = mine.WhichOneof("decision")
    if kind is None or kind == "allow":  # allow passes on
        return await next_()
    return mine  # deny or ask: this listener's own decision


# -- tools/post-execute: accept (and rewrite) or block a result -------------------------


def _fill_tool_post_execute(input: S.ToolCallResult, call: hk.HookCall) -> None:
    payload = call.tool_post_execute
    payload.invocation.CopyFrom(invocation(input.exec))
    payload.output.CopyFrom(tool_output(input.outcome))


def _read_tool_post_execute(result: hk.HookResult) -> d.PostToolDecision:
    return result.tool_post_execute


def _accept(decision: d.PostToolDecision) -> d.ToolAccept:
    return decision.accept


async def _apply_tool_post_execute(
    input: S.ToolCallResult,
    mine: d.PostToolDecision,
    next_: Next[S.ToolCallResult, d.PostToolDecision],
) -> d.PostToolDecision:
    if not mine.WhichOneof("decision"):
        return await next_()
    outcome = input.outcome

    async def rest(content: list[c.ContentBlock]) -> d.PostToolDecision:
        rewritten = ToolOutcome(content, outcome.is_error, outcome.error, outcome.meta,
                                list(outcome.contexts), outcome.final)  # fmt: skip
        return await next_(S.ToolCallResult(input.exec, rewritten))

    return await compose(mine, _accept, outcome.content, rest)


# -- tools/approval: allow once, reject, or abstain -------------------------------------


def _fill_tool_approval(ask: S.ApprovalAsk, call: hk.HookCall) -> None:
    call.tool_approval.approval.CopyFrom(ask.request)


def _read_tool_approval(result: hk.HookResult) -> hk.ToolApprovalResult:
    return result.tool_approval


def _answer_tool_approval(mine: hk.ToolApprovalResult) -> S.ApprovalAnswer:
    return mine.decision, mine.reason


# -- what match conditions read: the called tool's name ---------------------------------


def _tool_name(exec: ToolExecution) -> str:
    return exec.name


def _result_tool_name(input: S.ToolCallResult) -> str:
    return input.exec.name


def _approval_tool_name(ask: S.ApprovalAsk) -> str:
    return ask.request.tool_name


TOOL_CODECS: tuple[Codec, ...] = (
    Transform(
        S.TOOLS_PRE_EXECUTE, _fill_tool_pre_execute, _read_tool_pre_execute,
        _apply_tool_pre_execute, Facets(tool=_tool_name),
    ),
    Transform(
        S.TOOLS_POST_EXECUTE, _fill_tool_post_execute, _read_tool_post_execute,
        _apply_tool_post_execute, Facets(tool=_result_tool_name),
    ),
    Approve(
        S.TOOLS_APPROVAL, _fill_tool_approval, _read_tool_approval, _answer_tool_approval,
        Facets(tool=_approval_tool_name),
    ),
)  # fmt: skip
"""The codecs of the tool seams a plugin can answer."""
