"""The Python plugin helper as an approver (`tools/approval`), called as `Handle` would."""

from __future__ import annotations

from agentloop.plugin import sdk
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import approval_pb2 as ap
from tests.plugin_client import load_example


def approval_call(call_id: str, tool: str) -> hs.HookCall:
    request = ap.ApprovalRequested(approval_id=f"ap-{call_id}", call_id="m1", tool_name=tool)
    return hs.HookCall(
        call_id=call_id,
        seam=hs.SEAM_TOOLS_APPROVAL,
        kind=hs.CALL_KIND_SEAM,
        agent_id="a1",
        tool_approval=hs.ToolApprovalCall(approval=request),
    )


async def test_the_example_approver_allows_rejects_or_abstains() -> None:
    example = load_example("approver_plugin.py")
    plugin = example.build_plugin({"word_count"}, {"rm"}, "never rm")
    described = plugin.describe()
    assert [s.seam for s in described.subscriptions] == [hs.SEAM_TOOLS_APPROVAL]

    allowed = await plugin.handle(approval_call("c1", "word_count"))
    assert allowed is not None
    assert allowed.tool_approval.decision == ap.APPROVAL_DECISION_ALLOW_ONCE
    rejected = await plugin.handle(approval_call("c2", "rm"))
    assert rejected is not None
    assert (rejected.tool_approval.decision, rejected.tool_approval.reason) == (
        ap.APPROVAL_DECISION_REJECT,
        "never rm",
    )
    abstained = await plugin.handle(approval_call("c3", "other"))
    assert abstained is not None and abstained.WhichOneof("outcome") is None


async def test_an_approver_returning_another_decision_answers_an_error() -> None:
    plugin = sdk.Plugin("bad-approver")

    @plugin.tools_approval()  # type: ignore[arg-type]  # the wrong type, on purpose
    async def wrong(call: hs.HookCall) -> object:
        return sdk.deny("not an approval answer")

    result = await plugin.handle(approval_call("c1", "x"))
    assert result is not None and result.WhichOneof("outcome") == "error"
    assert "ToolApprovalResult" in result.error.message


def test_approver_decision_constructors() -> None:
    assert sdk.approve_once().decision == ap.APPROVAL_DECISION_ALLOW_ONCE
    assert sdk.reject_tool("no") == hs.ToolApprovalResult(
        decision=ap.APPROVAL_DECISION_REJECT, reason="no"
    )
