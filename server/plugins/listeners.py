"""Remote listeners: a plugin's subscriptions turned into seam listeners.

Each subscription becomes one listener in the seam registry, at the plugin's order and
under its name, so remote and in-process listeners share one order. The seam table
(the `seam` option of the plugin proto's `Seam` values) gives each seam's path, mode
and payload field; `CODECS` says, per seam, how its typed input becomes the call's
payload and how the plugin's decision becomes the seam's result. One adapter per mode
does the rest: on a transforming seam the plugin gets the current value and returns a
decision; an empty decision means "continue unchanged", and the next listener sees the
result. Observers are notifications and never block the loop.

This module has no transport: it talks to a `PluginCaller`, which the gRPC edge
implements over the plugin's `Handle` stream. A failed call (timeout, error, malformed
reply, disconnect) fails the turn under FAIL_CLOSED, naming the plugin and the seam,
and is skipped and counted under FAIL_OPEN.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, cast

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message as ProtoMessage

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from agentloop.plugin.seam_table import BY_SEAM, SPECS, SeamSpec
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from server.kernel import seams as S
from server.kernel.abort import AbortSignal
from server.kernel.errors import Aborted, TurnFatal
from server.kernel.seams import Next, SeamRegistry
from server.kernel.tools import ToolExecution, ToolOutcome
from server.loop.approvals import ASKED_BY
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


class Located(Protocol):
    """Where a seam call happens: every input of a seam a plugin answers has this."""

    @property
    def agent_id(self) -> str:
        """The calling agent."""
        ...

    @property
    def turn(self) -> int:
        """The turn (0 outside a turn)."""
        ...

    @property
    def step(self) -> int:
        """The step (0 outside a step)."""
        ...

    @property
    def signal(self) -> AbortSignal:
        """What withdraws the call."""
        ...


class Addressed(Protocol):
    """The agent an observed input is about."""

    @property
    def agent_id(self) -> str:
        """The agent."""
        ...


In = TypeVar("In")
A = TypeVar("A", bound=Addressed)
L = TypeVar("L", bound=Located)
Out = TypeVar("Out")
R = TypeVar("R", bound=ProtoMessage)

Fill = Callable[[In, hk.HookCall], None]
"""Writes a seam's input into the call's payload field (in place: one copy)."""

_HookCall = hk.HookCall
_SEAM_CALL = hk.CALL_KIND_SEAM
_NOTIFICATION = hk.CALL_KIND_NOTIFICATION


@dataclass
class RemoteListener:
    """One subscription of one plugin: the plugin call, its failure policy, its stats."""

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

    agent_ids: frozenset[str] = frozenset()
    """The agents the subscription is limited to (empty: all)."""

    _spec: SeamSpec = field(init=False, repr=False)
    _seam: hk.Seam.ValueType = field(init=False, repr=False)
    _deadline: Duration = field(init=False, repr=False)
    """`timeout` as each call carries it (copied, not converted per call)."""

    def __post_init__(self) -> None:
        if self.subscription.buffer_size:
            self.slot.limit = self.subscription.buffer_size
        self.event_kinds = frozenset(self.subscription.event_kinds)
        self.observe_only = self.subscription.observe_only
        self.agent_ids = frozenset(self.subscription.agent_ids)
        self._seam = self.subscription.seam
        self._spec = BY_SEAM[self._seam]
        self._deadline = Duration()
        self._deadline.FromNanoseconds(int(self.timeout * 1e9))

    @property
    def spec(self) -> SeamSpec:
        """The seam's row of the seam table."""
        return self._spec

    @property
    def seam_name(self) -> str:
        """The registry name of the seam."""
        return SEAM_NAMES[self.subscription.seam]

    @property
    def order(self) -> int:
        """The subscription's place among the seam's listeners."""
        return self.subscription.order

    def sees(self, agent_id: str) -> bool:
        """Whether the subscription covers `agent_id`."""
        return not self.agent_ids or agent_id in self.agent_ids

    def register(self, seams: SeamRegistry) -> Callable[[], None]:
        """Register on the seam, as its codec says; returns the disposer."""
        return CODECS[self.spec.path].register(self, seams)

    async def ask(self, at: Located, fill: Fill[In], input: In, kind: type[R]) -> R | None:
        """Call the plugin with `input`; its decision, or None ("continue unchanged").

        None too when a FAIL_OPEN failure skipped it (a FAIL_CLOSED one raises
        `TurnFatal`), and when the plugin only watches the seam (`observe_only`): then
        the call goes as a notification and the loop goes on at once.
        """
        spec = self._spec
        agent_id, turn, step = at.agent_id, at.turn, at.step
        if self.observe_only:
            if self.caller.admit(self.slot):
                notice = self.notice(agent_id)
                notice.turn, notice.step = turn, step
                fill(input, notice)
                self.caller.notify(notice, self.slot)
            return None
        call = _HookCall(
            call_id=f"c{next(call_ids)}",
            kind=_SEAM_CALL,
            seam=self._seam,
            agent_id=agent_id,
            session_id=self.session_of(agent_id),
            turn=turn,
            step=step,
        )
        fill(input, call)
        call.timeout.CopyFrom(self._deadline)
        try:
            with observe.plugin_call_scope(self.plugin, spec.path, agent_id, turn, step, call):
                result = await self.caller.call(call, self.timeout, at.signal)
            if checked(result, spec.payload) is None:
                return None
        except PluginCallFailed as failure:
            self.stats.errors += failure.kind != "timeout"
            if self.subscription.failure_policy == hk.FAILURE_POLICY_FAIL_OPEN:
                self.stats.fail_opens += 1
                _fail_open_log.log(
                    logging.WARNING, (self.plugin, spec.path),
                    'plugin "%s" failed at %s (%s: %s); skipped (fail-open)',
                    self.plugin, spec.path, failure.kind, failure,
                    extra=logs.fields(
                        plugin=self.plugin, seam=spec.path, agent=agent_id, turn=turn, step=step
                    ),
                )  # fmt: skip
                return None
            raise TurnFatal(
                f'plugin "{self.plugin}" failed at {spec.path}: {failure.kind}: {failure}',
                f"PLUGIN_{failure.kind.upper()}",
            ) from None
        decision = getattr(result, spec.payload)
        assert isinstance(decision, kind)  # `checked` made sure of the outcome's kind
        return decision

    def notice(self, agent_id: str) -> hk.HookCall:
        """A notification of this subscription; the caller fills its payload in place."""
        return _HookCall(
            call_id=f"n{next(call_ids)}",
            kind=_NOTIFICATION,
            seam=self._seam,
            agent_id=agent_id,
            session_id=self.session_of(agent_id),
        )

    async def tools_approval(self, ask: S.ApprovalAsk) -> S.ApprovalAnswer:
        """`tools/approval`: the plugin may allow once or reject; a failure abstains.

        Without a timeout of its own the call waits as long as the approval does; it
        is withdrawn (`CancelCall`) when the approval ends otherwise.
        """
        agent_id, request = ask.agent_id, ask.request
        if not self.sees(agent_id):
            return None
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
                result = await self.caller.call(call, seconds, ask.signal)
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


# -- one adapter per mode --------------------------------------------------------------


class Codec(Protocol):
    """How one seam's listener is made from a subscription."""

    @property
    def key(self) -> S.SeamKey:
        """The seam."""
        ...

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """Register the subscription's listener; returns the disposer."""
        ...


@dataclass(frozen=True)
class Transform(Generic[L, Out, R]):
    """A waterfall: the input goes out, the decision `R` comes back and is applied."""

    key: S.Waterfall[L, Out]
    decision: type[R]
    apply: Callable[[RemoteListener, L, R, Next[L, Out]], Awaitable[Out]]
    """What a decision does: usually `next(input with the decision's value)`."""
    fill: Fill[L] | None = None
    """How the input fills the payload; None: field by field, by name."""

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener asks the plugin, then applies its decision (none: `next()`)."""
        fill = self.fill or fill_by_name(remote.spec.payload)

        async def listener(input: L, next_: Next[L, Out]) -> Out:
            if not remote.sees(input.agent_id):
                return await next_()
            decision = await remote.ask(input, fill, input, self.decision)
            if decision is None:
                return await next_()
            return await self.apply(remote, input, decision, next_)

        return seams.on(self.key, listener, order=remote.order, name=remote.plugin)


@dataclass(frozen=True)
class Wrap(Generic[L, Out, R]):
    """A waterfall that flows outward: the plugin sees what the rest composed."""

    key: S.Waterfall[L, Out]
    fill: Fill[Out]
    decision: type[R]
    apply: Callable[[R], Out]

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener awaits `next()`, then the plugin may replace its result."""

        async def listener(input: L, next_: Next[L, Out]) -> Out:
            inner = await next_()
            if not remote.sees(input.agent_id):
                return inner
            decision = await remote.ask(input, self.fill, inner, self.decision)
            return inner if decision is None else self.apply(decision)

        return seams.on(self.key, listener, order=remote.order, name=remote.plugin)


@dataclass(frozen=True)
class Check(Generic[L, Out, R]):
    """A checkpoint: the plugin's decision may bail out of the chain."""

    key: S.Serial[L, Out]
    decision: type[R]
    decide: Callable[[L, R], Out | None]
    fill: Fill[L] | None = None
    """How the input fills the payload; None: field by field, by name."""

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener asks the plugin; its decision says whether to bail."""
        fill = self.fill or fill_by_name(remote.spec.payload)

        async def listener(input: L) -> Out | None:
            if not remote.sees(input.agent_id):
                return None
            decision = await remote.ask(input, fill, input, self.decision)
            return None if decision is None else self.decide(input, decision)

        return seams.on(self.key, listener, order=remote.order, name=remote.plugin)


@dataclass(frozen=True)
class Watch(Generic[A]):
    """An observer: filtered, then admitted, and only then built (never blocking)."""

    key: S.Emit[A]
    fill: Fill[A] | None = None
    """How the input fills the payload; None: field by field, by name."""
    wanted: Callable[[RemoteListener], Callable[[A], bool] | None] | None = None
    """The subscription's own filter, if it has one (None: every input)."""

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener sends a notification when there is room."""
        # Bound once: observers run for every event, chunks included.
        caller, slot, agent_ids = remote.caller, remote.slot, remote.agent_ids
        fill = self.fill or fill_by_name(remote.spec.payload)
        wanted = self.wanted(remote) if self.wanted is not None else None

        def listener(input: A) -> None:
            if agent_ids and input.agent_id not in agent_ids:
                return
            if wanted is not None and not wanted(input):
                return
            if caller.admit(slot):
                call = remote.notice(input.agent_id)
                fill(input, call)
                caller.notify(call, slot)

        return seams.on(self.key, listener, order=remote.order, name=remote.plugin)


@dataclass(frozen=True)
class Approve:
    """An approver: called concurrently by the approvals; a failure abstains."""

    key: S.Gather[S.ApprovalAsk, S.ApprovalAnswer]

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener is `RemoteListener.tools_approval`."""
        return seams.on(self.key, remote.tools_approval, order=remote.order, name=remote.plugin)


# -- the codecs: per seam, its input as a payload, and its decision applied -------------


async def _prompt_submit(
    remote: RemoteListener, input: S.PromptSubmit, mine: d.PromptDecision,
    next_: Next[S.PromptSubmit, d.PromptDecision],
) -> d.PromptDecision:  # fmt: skip
    async def rest(content: list[c.ContentBlock]) -> d.PromptDecision:
        return await next_(dataclasses.replace(input, content=content))

    return await compose(mine, "allow", input.content, rest)


async def _turn_continuation(
    remote: RemoteListener, input: S.TurnContinuation, mine: d.ContinuationDecision,
    next_: Next[S.TurnContinuation, d.ContinuationDecision],
) -> d.ContinuationDecision:  # fmt: skip
    if not mine.WhichOneof("decision"):
        return await next_()
    return await next_(dataclasses.replace(input, decision=mine))


async def _tools_pre_execute(
    remote: RemoteListener, exec: ToolExecution, mine: d.PreToolDecision,
    next_: Next[ToolExecution, d.PreToolDecision],
) -> d.PreToolDecision:  # fmt: skip
    kind = mine.WhichOneof("decision")
    if kind is None or kind == "allow":  # allow passes on
        return await next_()
    if kind == "ask":
        ASKED_BY[exec] = f"plugin:{remote.plugin}"
    return mine


async def _tools_post_execute(
    remote: RemoteListener, input: S.ToolCallResult, mine: d.PostToolDecision,
    next_: Next[S.ToolCallResult, d.PostToolDecision],
) -> d.PostToolDecision:  # fmt: skip
    if not mine.WhichOneof("decision"):
        return await next_()
    outcome = input.outcome

    async def rest(content: list[c.ContentBlock]) -> d.PostToolDecision:
        rewritten = ToolOutcome(content, outcome.is_error, outcome.error, outcome.meta,
                                list(outcome.contexts), outcome.final)  # fmt: skip
        return await next_(S.ToolCallResult(input.exec, rewritten))

    return await compose(mine, "accept", outcome.content, rest)


def _fill_session_prefix(prefix: list[c.Message], call: hk.HookCall) -> None:
    call.session_prefix.prefix.extend(prefix)


def _fill_tool_pre_execute(exec: ToolExecution, call: hk.HookCall) -> None:
    call.tool_pre_execute.invocation.CopyFrom(invocation(exec))


def _fill_tool_post_execute(input: S.ToolCallResult, call: hk.HookCall) -> None:
    call.tool_post_execute.invocation.CopyFrom(invocation(input.exec))
    call.tool_post_execute.output.CopyFrom(tool_output(input.outcome))


def _pre_step(input: S.PreStep, mine: hk.PreStepResult) -> None:
    for context in mine.contexts:  # the plugin adds context before the step
        input.agent.inject(context)


def _turn_stop(input: S.TurnStop, mine: hk.TurnStopResult) -> d.ContinuationStop | None:
    return d.ContinuationStop() if mine.stop else None


def _fill_session_event(input: S.SessionEventSeen, call: hk.HookCall) -> None:
    call.session_event.event.CopyFrom(input.event)  # one copy, not one per nesting level


def _wanted_session_event(
    remote: RemoteListener,
) -> Callable[[S.SessionEventSeen], bool] | None:
    kinds = remote.event_kinds
    if not kinds:
        return None  # every event: no filter to run per event

    def wanted(input: S.SessionEventSeen) -> bool:
        return input.event.WhichOneof("payload") in kinds

    return wanted


def _fill_agent_event(input: S.AgentEventSeen, call: hk.HookCall) -> None:
    call.agent_event.event.CopyFrom(input.event)


def _fill_tool_result(input: S.ToolCallResult, call: hk.HookCall) -> None:
    call.tool_result.invocation.CopyFrom(invocation(input.exec))
    call.tool_result.output.CopyFrom(tool_output(input.outcome))


_CODECS: tuple[Codec, ...] = (
    Transform(S.PROMPT_SUBMIT, d.PromptDecision, _prompt_submit),
    Wrap(S.SESSION_PREFIX, _fill_session_prefix, hk.SessionPrefixResult,
         lambda mine: list(mine.prefix)),
    Check(S.PRE_STEP, hk.PreStepResult, _pre_step),
    Transform(S.TURN_CONTINUATION, d.ContinuationDecision, _turn_continuation),
    Check(S.TURN_STOP, hk.TurnStopResult, _turn_stop),
    Transform(S.TOOLS_PRE_EXECUTE, d.PreToolDecision, _tools_pre_execute,
              _fill_tool_pre_execute),
    Transform(S.TOOLS_POST_EXECUTE, d.PostToolDecision, _tools_post_execute,
              _fill_tool_post_execute),
    Watch(S.SESSION_COMMITTED, _fill_session_event, _wanted_session_event),
    Watch(S.AGENT_EVENT, _fill_agent_event),
    Watch(S.TOOLS_RESULT_COMMITTED, _fill_tool_result),
    Approve(S.TOOLS_APPROVAL),
)  # fmt: skip


# -- the default codec: fields copied by name ----------------------------------------------


_EXTEND, _COPY, _SET = 0, 1, 2
"""How `fill_by_name` writes a field: a repeated one, a message, a scalar."""


def fill_by_name(payload: str) -> Fill[object]:
    """Fill the call's `payload` message field by field from the input's same-named attributes."""
    message_type = hk.HookCall.DESCRIPTOR.fields_by_name[payload].message_type
    assert message_type is not None, f"{payload} is not a message field"
    fields = message_type.fields
    # Read once: per field, its name and how it is written (extend, copy or set).
    plan = [
        (f.name, _EXTEND if f.is_repeated else _COPY if f.message_type is not None else _SET)
        for f in fields
    ]

    def fill(input: object, call: hk.HookCall) -> None:
        message = getattr(call, payload)
        message.SetInParent()
        for name, how in plan:
            value = getattr(input, name)
            if how == _SET:
                setattr(message, name, value)
            elif how == _COPY:
                getattr(message, name).CopyFrom(value)
            else:
                getattr(message, name).extend(value)

    return fill


async def replace_by_name(remote: RemoteListener, input: L, mine: R, next_: Next[L, Out]) -> Out:
    """Pass on the input with each field of the decision replacing its same-named attribute."""
    changes: dict[str, object] = {}
    for member in mine.DESCRIPTOR.fields:
        value = getattr(mine, member.name)
        changes[member.name] = list(value) if member.is_repeated else value
    replaced = dataclasses.replace(cast("DataclassInstance", input), **changes)
    return await next_(cast(L, replaced))


def bail_if_set(input: object, mine: R) -> R | None:
    """A checkpoint's decision bails when it sets anything."""
    return mine if mine.ListFields() else None


def _default_codec(spec: SeamSpec) -> Codec:
    """A seam without a codec of its own: its input and decision map to the payloads by name."""
    key = S.KEYS.get(spec.path)
    decision = spec.decision
    if isinstance(key, S.Waterfall) and spec.mode == hk.SEAM_MODE_WATERFALL and decision:
        return Transform(key, decision, replace_by_name)
    if isinstance(key, S.Serial) and spec.mode == hk.SEAM_MODE_SERIAL and decision:
        return Check(key, decision, bail_if_set)
    if isinstance(key, S.Emit) and spec.mode == hk.SEAM_MODE_OBSERVER:
        return Watch(key)
    raise RuntimeError(f"seam {spec.path}: no key of its mode in server.kernel.seams")


def _codecs() -> dict[str, Codec]:
    """A codec per seam of the table, of its mode: its own, or the default one."""
    by_path = {codec.key.path: codec for codec in _CODECS}
    modes: dict[int, tuple[type, ...]] = {
        hk.SEAM_MODE_WATERFALL: (Transform, Wrap),
        hk.SEAM_MODE_SERIAL: (Check,),
        hk.SEAM_MODE_OBSERVER: (Watch,),
        hk.SEAM_MODE_APPROVER: (Approve,),
    }
    codecs: dict[str, Codec] = {}
    for spec in SPECS:
        codec = by_path.get(spec.path) or _default_codec(spec)
        if not isinstance(codec, modes[spec.mode]):
            raise RuntimeError(f"seam {spec.path}: its codec is not of its mode")
        codecs[spec.path] = codec
    return codecs


CODECS = _codecs()
"""How each seam of the table is served by a plugin, by seam path."""


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
