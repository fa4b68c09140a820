"""Remote listeners: a plugin's subscriptions turned into seam listeners and tools.

Each subscription becomes one listener in the seam registry, at the plugin's order and
under its name, so remote and in-process listeners share one order. On a transforming
seam the plugin gets the current value and returns a decision; an empty decision
means "continue unchanged", and the next listener sees the result. Observers are
notifications and never block the loop.

This module has no transport: it talks to a `PluginCaller`, which the gRPC edge
implements over the plugin's `Handle` stream. A failed call (timeout, error, malformed
reply, disconnect) fails the turn under FAIL_CLOSED, naming the plugin and the seam,
and is skipped and counted under FAIL_OPEN.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentloop.plugin.seam_table import BY_SEAM, SPECS
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import approval_pb2 as ap
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from server.core.abort import AbortSignal
from server.core.approvals import ASKED_BY
from server.core.errors import Aborted, TurnFatal
from server.core.tools import ToolExecution, ToolOutcome
from server.observability import logs, observe
from server.plugins.calls import (
    NoticeSlot,
    PluginCaller,
    PluginCallFailed,
    PluginStats,
    call_ids,
    checked,
    invocation,
    tool_output,
)

log = logging.getLogger(__name__)
_fail_open_log = logs.RateLimited(log)
"""A plugin that is down fails every call: one line per plugin and seam per interval."""

SEAM_NAMES = {spec.seam: spec.path for spec in SPECS}
"""Each contract seam and the registry seam it listens on (from the proto's seam table)."""


def _mode(mode: hk.SeamMode.ValueType) -> frozenset[int]:
    return frozenset(spec.seam for spec in SPECS if spec.mode == mode)


CHECKPOINTS = _mode(hk.SEAM_MODE_SERIAL)
OBSERVERS = _mode(hk.SEAM_MODE_OBSERVER)
APPROVERS = _mode(hk.SEAM_MODE_APPROVER)
WATERFALLS = _mode(hk.SEAM_MODE_WATERFALL)


@dataclass
class RemoteListener:
    """One subscription of one plugin, callable as the seam expects."""

    plugin: str
    subscription: hk.Subscription
    caller: PluginCaller
    stats: PluginStats
    session_of: Callable[[str], str]
    timeout: float
    slot: NoticeSlot = field(default_factory=NoticeSlot)
    """The buffer share of an observer subscription."""

    event_kinds: frozenset[str] = frozenset()
    """The session event kinds asked for (empty: all), read once: checked per event."""
    observe_only: bool = False
    """The plugin only watches this seam: its calls go as notifications, unanswered."""

    def __post_init__(self) -> None:
        if self.subscription.buffer_size:
            self.slot.limit = self.subscription.buffer_size
        self.event_kinds = frozenset(self.subscription.event_kinds)
        self.observe_only = self.subscription.observe_only

    @property
    def seam_name(self) -> str:
        """The registry name of the seam."""
        return SEAM_NAMES[self.subscription.seam]

    async def invoke(
        self, agent_id: str, turn: int, step: int, signal: AbortSignal, **payload: Any
    ) -> hk.HookResult | None:
        """Call the plugin; None when a FAIL_OPEN failure skipped it, or when it watches.

        A plugin that only watches the seam (`observe_only`) gets the call as a
        notification, and the loop goes on at once ("continue unchanged").
        """
        seam = self.subscription.seam
        if self.observe_only:
            if self.caller.admit(self.slot):
                call = self.notice(agent_id, turn=turn, step=step, **payload)
                self.caller.notify(call, self.slot)
            return None
        call = hk.HookCall(
            call_id=f"c{next(call_ids)}",
            kind=hk.CALL_KIND_SEAM,
            seam=seam,
            agent_id=agent_id,
            session_id=self.session_of(agent_id),
            turn=turn,
            step=step,
            **payload,
        )
        call.timeout.FromNanoseconds(int(self.timeout * 1e9))
        expected = BY_SEAM[seam].payload
        try:
            with observe.plugin_call_scope(self.plugin, self.seam_name, agent_id, turn, step, call):
                result = await self.caller.call(call, self.timeout, signal)
            checked(result, expected)
        except PluginCallFailed as failure:
            self.stats.errors += failure.kind != "timeout"
            if self.subscription.failure_policy == hk.FAILURE_POLICY_FAIL_OPEN:
                self.stats.fail_opens += 1
                _fail_open_log.log(
                    logging.WARNING, (self.plugin, self.seam_name),
                    'plugin "%s" failed at %s (%s: %s); skipped (fail-open)',
                    self.plugin, self.seam_name, failure.kind, failure,
                    extra=logs.fields(
                        plugin=self.plugin, seam=self.seam_name, agent=agent_id, turn=turn,
                        step=step,
                    ),
                )  # fmt: skip
                return None
            raise TurnFatal(
                f'plugin "{self.plugin}" failed at {self.seam_name}: {failure.kind}: {failure}',
                f"PLUGIN_{failure.kind.upper()}",
            ) from None
        return result

    def notify(self, agent_id: str, **payload: Any) -> None:
        """Send an observer notification (admitted already)."""
        self.caller.notify(self.notice(agent_id, **payload), self.slot)

    def notice(self, agent_id: str, **payload: Any) -> hk.HookCall:
        """A notification of this subscription; the caller may fill its payload in place."""
        return hk.HookCall(
            call_id=f"n{next(call_ids)}",
            kind=hk.CALL_KIND_NOTIFICATION,
            seam=self.subscription.seam,
            agent_id=agent_id,
            session_id=self.session_of(agent_id),
            **payload,
        )

    def listener(self) -> Callable[..., Any]:
        """The function registered on the seam, filtered by the subscription's agents."""
        fn = self._listener()
        agent_ids = frozenset(self.subscription.agent_ids)
        if not agent_ids:
            return fn
        seam = self.subscription.seam
        if seam in WATERFALLS:

            async def waterfall(*args: Any) -> Any:
                if args[0].agent_id not in agent_ids:
                    return await args[-1]()
                return await fn(*args)

            return waterfall
        if seam in CHECKPOINTS:

            async def checkpoint(*args: Any) -> Any:
                return await fn(*args) if args[0].agent_id in agent_ids else None

            return checkpoint
        if seam in APPROVERS:

            async def approver(*args: Any) -> Any:
                return await fn(*args) if args[0] in agent_ids else None

            return approver

        def observer(*args: Any) -> None:
            if args[0].agent_id in agent_ids:
                fn(*args)

        return observer

    def _listener(self) -> Callable[..., Any]:
        """The method named by the seam table's `method` (`prompt_submit`, ...)."""
        fn: Callable[..., Any] = getattr(self, BY_SEAM[self.subscription.seam].method)
        return fn

    # -- transforming seams ------------------------------------------------------------

    async def prompt_submit(
        self, agent: Any, content: list[c.ContentBlock], source: c.Source, next_: Next
    ) -> d.PromptDecision:
        """`agent/prompt-submit`: the plugin decides; a rewrite is what later listeners see."""
        result = await self.invoke(
            agent.agent_id, agent.session.open_turn, 0, agent.turn_signal(),
            prompt_submit=hk.PromptSubmitCall(content=content, source=source),
        )  # fmt: skip
        if result is None or not result.HasField("prompt_submit"):
            return await next_()  # type: ignore[no-any-return]

        async def rest(rewritten: list[c.ContentBlock]) -> d.PromptDecision:
            inner: d.PromptDecision = await next_(agent, rewritten, source)
            return inner

        return await compose(result.prompt_submit, "allow", content, rest)

    async def session_prefix(
        self, agent: Any, seed: Any, signal: AbortSignal, next_: Next
    ) -> list[c.Message]:
        """`agent/session-prefix`: the plugin may replace the prefix composed inside it."""
        # The prefix flows outward (contributors prepend to what `next()` composed).
        prefix: list[c.Message] = list(await next_())
        result = await self.invoke(
            agent.agent_id, agent.session.open_turn, 0, signal,
            session_prefix=hk.SessionPrefixCall(prefix=prefix),
        )  # fmt: skip
        if result is None or not result.HasField("session_prefix"):
            return prefix
        return list(result.session_prefix.prefix)

    async def request(
        self, agent: Any, turn: int, step: int, config: c.ModelConfig, next_: Next
    ) -> c.ModelConfig:
        """`agent/request`: the plugin may replace the model configuration."""
        result = await self.invoke(
            agent.agent_id, turn, step, agent.turn_signal(), request=hk.RequestCall(config=config)
        )
        if result is None or not result.HasField("request"):
            return await next_()  # type: ignore[no-any-return]
        return await next_(agent, turn, step, result.request.config)  # type: ignore[no-any-return]

    async def step_result(
        self, agent: Any, turn: int, step: int, message: c.Message, next_: Next
    ) -> c.Message:
        """`agent/step-result`: the plugin may replace the assistant message."""
        result = await self.invoke(
            agent.agent_id, turn, step, agent.turn_signal(),
            step_result=hk.StepResultCall(message=message),
        )  # fmt: skip
        if result is None or not result.HasField("step_result"):
            return await next_()  # type: ignore[no-any-return]
        return await next_(agent, turn, step, result.step_result.message)  # type: ignore[no-any-return]

    async def turn_continuation(
        self, agent: Any, turn: int, decision: d.ContinuationDecision, next_: Next
    ) -> d.ContinuationDecision:
        """`agent/turn-continuation`: the plugin may decide stop or continue."""
        result = await self.invoke(
            agent.agent_id, turn, 0, agent.turn_signal(),
            turn_continuation=hk.TurnContinuationCall(decision=decision),
        )  # fmt: skip
        if result is None or not result.turn_continuation.WhichOneof("decision"):
            return await next_()  # type: ignore[no-any-return]
        return await next_(agent, turn, result.turn_continuation)  # type: ignore[no-any-return]

    async def tools_pre_execute(self, exec: ToolExecution, next_: Next) -> d.PreToolDecision:
        """`tools/pre-execute`: the plugin may deny or ask; allow passes on."""
        result = await self.invoke(
            exec.agent_id, exec.turn, exec.step, exec.signal,
            tool_pre_execute=hk.ToolPreExecuteCall(invocation=invocation(exec)),
        )  # fmt: skip
        if result is None or result.tool_pre_execute.WhichOneof("decision") in (None, "allow"):
            return await next_()  # type: ignore[no-any-return]
        if result.tool_pre_execute.HasField("ask"):
            ASKED_BY[exec] = f"plugin:{self.plugin}"
        return result.tool_pre_execute

    async def tools_post_execute(
        self, exec: ToolExecution, outcome: ToolOutcome, next_: Next
    ) -> d.PostToolDecision:
        """`tools/post-execute`: the plugin may rewrite or block the result."""
        result = await self.invoke(
            exec.agent_id, exec.turn, exec.step, exec.signal,
            tool_post_execute=hk.ToolPostExecuteCall(
                invocation=invocation(exec), output=tool_output(outcome)
            ),
        )  # fmt: skip
        if result is None or not result.tool_post_execute.WhichOneof("decision"):
            return await next_()  # type: ignore[no-any-return]

        async def rest(content: list[c.ContentBlock]) -> d.PostToolDecision:
            rewritten = ToolOutcome(content, outcome.is_error, outcome.error, outcome.meta,
                                    list(outcome.contexts), outcome.final)  # fmt: skip
            inner: d.PostToolDecision = await next_(exec, rewritten)
            return inner

        return await compose(result.tool_post_execute, "accept", outcome.content, rest)

    # -- approvers ---------------------------------------------------------------------

    async def tools_approval(
        self, agent_id: str, request: ap.ApprovalRequested, signal: AbortSignal
    ) -> tuple[ap.ApprovalDecision.ValueType, str] | None:
        """`tools/approval`: the plugin may allow once or reject; a failure abstains.

        Without a timeout of its own the call waits as long as the approval does; it
        is withdrawn (`CancelCall`) when the approval ends otherwise.
        """
        seconds = self.timeout
        if not self.subscription.HasField("timeout"):
            seconds = max(request.expire_time.ToNanoseconds() / 1e9 - time.time(), 0.001)
        call = hk.HookCall(
            call_id=f"c{next(call_ids)}",
            kind=hk.CALL_KIND_SEAM,
            seam=hk.SEAM_TOOLS_APPROVAL,
            agent_id=agent_id,
            session_id=self.session_of(agent_id),
            turn=request.turn,
            step=request.step,
            tool_approval=hk.ToolApprovalCall(approval=request),
        )
        call.timeout.FromNanoseconds(int(seconds * 1e9))
        try:
            with observe.plugin_call_scope(
                self.plugin, self.seam_name, agent_id, request.turn, request.step
            ):
                result = await self.caller.call(call, seconds, signal)
            kind = checked(result, "tool_approval")
        except PluginCallFailed as failure:
            self.stats.errors += failure.kind != "timeout"
            log.warning(
                'plugin "%s" failed at %s (%s: %s); it abstains',
                self.plugin, self.seam_name, failure.kind, failure,
            )  # fmt: skip
            return None
        except Aborted:
            return None  # the approval ended otherwise
        if kind is None:
            return None
        return result.tool_approval.decision, result.tool_approval.reason

    # -- checkpoints -------------------------------------------------------------------

    async def pre_step(
        self, agent: Any, turn: int, step: int, system: str, prefix: Any, signal: AbortSignal
    ) -> None:
        """`agent/pre-step`: the plugin may add context before the step."""
        result = await self.invoke(
            agent.agent_id, turn, step, signal,
            pre_step=hk.PreStepCall(system=system, prefix=prefix or ()),
        )  # fmt: skip
        if result is not None:
            for context in result.pre_step.contexts:
                agent.inject(context)

    async def turn_stop(self, agent: Any, turn: int) -> d.ContinuationStop | None:
        """`agent/turn-stop`: the plugin may make the stop terminal."""
        result = await self.invoke(
            agent.agent_id, turn, 0, agent.turn_signal(), turn_stop=hk.TurnStopCall()
        )
        if result is not None and result.turn_stop.stop:
            return d.ContinuationStop()
        return None

    # -- observers ---------------------------------------------------------------------

    # Each filters, then asks for room, and only then builds the message.

    def on_session_event(self, agent: Any, event: ev.SessionEvent) -> None:
        """Forward a session event, when its kind is one the plugin asked for."""
        kinds = self.event_kinds
        if kinds and event.WhichOneof("payload") not in kinds:
            return
        if self.caller.admit(self.slot):
            call = self.notice(agent.agent_id)
            call.session_event.event.CopyFrom(event)  # one copy, not one per nesting level
            self.caller.notify(call, self.slot)

    def on_agent_event(self, agent: Any, event: ae.AgentEvent) -> None:
        """Forward a live agent event."""
        if self.caller.admit(self.slot):
            call = self.notice(agent.agent_id)
            call.agent_event.event.CopyFrom(event)
            self.caller.notify(call, self.slot)

    def on_tool_result(self, exec: ToolExecution, outcome: ToolOutcome) -> None:
        """Forward a final tool result."""
        if self.caller.admit(self.slot):
            notice = hk.ToolResultNotice(invocation=invocation(exec), output=tool_output(outcome))
            self.notify(exec.agent_id, tool_result=notice)


Next = Callable[..., Awaitable[Any]]

Rewrite = TypeVar("Rewrite", d.PromptDecision, d.PostToolDecision)


async def compose(
    mine: Rewrite,
    allow: str,
    content: list[c.ContentBlock],
    rest: Callable[[list[c.ContentBlock]], Awaitable[Rewrite]],
) -> Rewrite:
    """A plugin's rewriting decision composed with the rest of the chain.

    Its block stands; otherwise the rest of the chain sees its rewrite of `content`
    (or `content` unchanged), a block there stands, and else the outcome is the
    innermost rewrite with the contexts of both, the plugin's first. `allow` names
    the decision's allow member (`allow` of a prompt, `accept` of a tool result).
    """
    if mine.HasField("block"):
        return mine
    rewritten = list(getattr(mine, allow).content) or content
    inner: Rewrite = await rest(rewritten)
    if inner.HasField("block"):
        return inner
    composed = type(mine)()
    merged = getattr(composed, allow)
    merged.SetInParent()
    merged.content.extend(list(getattr(inner, allow).content) or rewritten)
    merged.additional_contexts.extend(
        [*getattr(mine, allow).additional_contexts, *getattr(inner, allow).additional_contexts]
    )
    return composed
