"""An approver plugin's calls go through `RemoteListener.ask`, with the approver's rules:
its deadline is the approval's unless it set its own, and a failure, a timeout or the
approval's end only abstain (None), whatever the failure policy."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable

import pytest

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import approval_pb2 as ap
from server.kernel import seams as S
from server.kernel.abort import NEVER, AbortController, AbortSignal
from server.kernel.errors import Aborted
from server.kernel.seams import SeamRegistry
from server.plugins import codecs
from server.plugins.calls import PluginStats
from server.plugins.listeners import RemoteListener
from tests.test_plugin_listeners import FakeCaller

ALLOW = hk.HookResult(
    tool_approval=hk.ToolApprovalResult(decision=ap.APPROVAL_DECISION_ALLOW_ONCE, reason="fine")
)


Answer = Callable[[S.ApprovalAsk], Awaitable[S.ApprovalAnswer]]


def approver(caller: FakeCaller, **subscription: object) -> tuple[Answer, PluginStats]:
    """The `tools/approval` listener of one subscription, as the approvals call it."""
    seams, stats = SeamRegistry(), PluginStats()
    sub = hk.Subscription(seam=hk.SEAM_TOOLS_APPROVAL, **subscription)  # type: ignore[arg-type]
    remote = RemoteListener("judge", sub, caller, stats, lambda a: f"{a}-session", 2.5)
    codecs.register(remote, seams)
    # For no agent: the listener itself, even where its agent conditions route it past.
    (registration,) = seams.listeners(S.TOOLS_APPROVAL, None)
    assert (registration.name, registration.origin) == ("judge", "plugin:judge")

    async def answer(ask: S.ApprovalAsk) -> S.ApprovalAnswer:
        result = registration.fn(ask)
        return await result if inspect.isawaitable(result) else result

    return answer, stats


def asking(expires_in: float = 60.0, signal: AbortSignal = NEVER) -> S.ApprovalAsk:
    request = ap.ApprovalRequested(
        approval_id="ap-1", call_id="t1", tool_name="echo", turn=3, step=2
    )
    request.expire_time.FromNanoseconds(int((time.time() + expires_in) * 1e9))
    return S.ApprovalAsk("a1", request, signal)


async def test_an_answer_is_the_decision_and_reason_and_the_call_is_the_approvals() -> None:
    caller = FakeCaller(ALLOW)
    listen, stats = approver(caller)
    ask = asking(expires_in=60.0)
    assert await listen(ask) == (ap.APPROVAL_DECISION_ALLOW_ONCE, "fine")
    (call,) = caller.calls
    assert (call.kind, call.seam, call.agent_id, call.session_id) == (
        hk.CALL_KIND_SEAM, hk.SEAM_TOOLS_APPROVAL, "a1", "a1-session",
    )  # fmt: skip
    assert (call.turn, call.step) == (3, 2)
    assert call.tool_approval.approval == ask.request
    # No timeout of its own: the call waits as long as the approval does.
    assert 55.0 < call.timeout.ToNanoseconds() / 1e9 <= 60.0
    assert not call.traceparent
    assert (stats.errors, stats.fail_opens) == (0, 0)


async def test_a_timeout_of_its_own_is_the_calls_deadline() -> None:
    caller = FakeCaller(ALLOW)
    listen, _ = approver(caller, timeout={"seconds": 2, "nanos": 500_000_000})
    await listen(asking(expires_in=60.0))
    (call,) = caller.calls
    assert call.timeout.ToNanoseconds() == 2_500_000_000


@pytest.mark.parametrize(
    ("fail", "errors"), [("error", 1), ("malformed", 1), ("disconnected", 1), ("timeout", 0)]
)
async def test_a_failure_only_abstains_even_under_fail_closed(fail: str, errors: int) -> None:
    caller = FakeCaller(fail=fail)
    listen, stats = approver(caller, failure_policy=hk.FAILURE_POLICY_FAIL_CLOSED)
    assert await listen(asking()) is None
    assert len(caller.calls) == 1
    assert (stats.errors, stats.fail_opens) == (errors, 0)


async def test_an_unset_answer_abstains_and_the_approvals_end_withdraws_quietly() -> None:
    listen, stats = approver(FakeCaller(hk.HookResult()))
    assert await listen(asking()) is None

    class Withdrawn(FakeCaller):
        async def call(
            self, call: hk.HookCall, seconds: float, signal: AbortSignal
        ) -> hk.HookResult:
            self.calls.append(call)
            raise Aborted("approval already resolved by api")

    ended = AbortController()
    listen, stats = approver(Withdrawn())
    assert await listen(asking(signal=ended.signal)) is None
    assert (stats.errors, stats.fail_opens) == (0, 0)


async def test_an_agent_filter_keeps_other_agents_approvals_from_the_plugin() -> None:
    caller = FakeCaller(ALLOW)
    listen, _ = approver(caller, agent_ids=["b1"])
    assert await listen(asking()) is None
    assert caller.calls == []


def test_an_agent_filter_routes_other_agents_approvals_past_the_plugin_counted() -> None:
    seams, stats = SeamRegistry(), PluginStats()
    sub = hk.Subscription(seam=hk.SEAM_TOOLS_APPROVAL, agent_ids=["b1"])
    remote = RemoteListener("judge", sub, FakeCaller(ALLOW), stats, lambda a: "s", 2.5)
    codecs.register(remote, seams)
    assert [r.name for r in seams.listeners(S.TOOLS_APPROVAL, "b1")] == ["judge"]
    assert stats.skipped == {}
    # Another agent's approvals: no approver to ask, and each ask counted skipped.
    assert not seams.has(S.TOOLS_APPROVAL, "a1")
    assert seams.listeners(S.TOOLS_APPROVAL, "a1") == []
    assert stats.skipped == {hk.SEAM_TOOLS_APPROVAL: 2}
