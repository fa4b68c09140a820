"""Remote listeners: a plugin's subscriptions, each one call path to the plugin.

Each subscription becomes one listener in the seam registry, at the plugin's order and
under its name, so remote and in-process listeners share one order. The seam table
(the `seam` option of the plugin proto's `Seam` values) gives each seam's path, mode
and payload field; `server.plugins.codecs` says, per seam, how its typed input fills
the call's payload and how the plugin's decision is read and applied, and
`server.plugins.modes` makes the listener of each mode. Every call of a subscription,
the approvals' included, goes through `RemoteListener.ask`.

This module has no transport: it talks to a `PluginCaller`, which the gRPC edge
implements over the plugin's `Handle` stream. A failed call (timeout, error, malformed
reply, disconnect) fails the turn under FAIL_CLOSED, naming the plugin and the seam,
and is skipped and counted under FAIL_OPEN; at an approver it only abstains.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message as ProtoMessage

from agentloop.plugin.seam_table import BY_SEAM, SPECS, SeamSpec
from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.kernel.abort import AbortSignal
from server.kernel.errors import Aborted, TurnFatal
from server.kernel.seams import Seam, SeamRegistry
from server.observability import logs, observe
from server.plugins.calls import (
    NoticeSlot,
    PluginCaller,
    PluginCallFailed,
    PluginStats,
    call_ids,
    checked,
)
from server.plugins.conditions import (
    NO_FACETS,
    Facets,
    LabelsOf,
    agent_filter,
    compile_matcher,
    facet_filter,
    no_labels,
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


In = TypeVar("In")
Fn = TypeVar("Fn")
R = TypeVar("R", bound=ProtoMessage)

Fill = Callable[[In, hk.HookCall], None]
"""Writes a seam's input into the call's payload field (in place: one copy)."""
Read = Callable[[hk.HookResult], R]
"""Reads the plugin's decision from the result's outcome field of the seam."""

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

    observe_only: bool = False
    """The plugin only watches this seam: its calls go as notifications, unanswered."""

    agent_ids: frozenset[str] = frozenset()
    """The agents the subscription is limited to (empty: all)."""
    labels_of: LabelsOf = no_labels
    """The labels of a live agent, for `MatchConditions.agent_labels`."""

    _spec: SeamSpec = field(init=False, repr=False)
    _seam: hk.Seam.ValueType = field(init=False, repr=False)
    _deadline: Duration = field(init=False, repr=False)
    """`timeout` as each call carries it (copied, not converted per call)."""

    def __post_init__(self) -> None:
        if self.subscription.buffer_size:
            self.slot.limit = self.subscription.buffer_size
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

    @property
    def origin(self) -> str:
        """Who the listener speaks for in the records its decisions cause."""
        return f"plugin:{self.plugin}"

    def matcher(self, facets: Facets[In]) -> Callable[[In], bool] | None:
        """The subscription's conditions over the seam's input; None: every call matches."""
        return compile_matcher(self.subscription, facets, self.labels_of)

    @property
    def skip_count(self) -> tuple[defaultdict[int, int], int]:
        """Where a call its conditions skip is counted: `counts[seam] += 1`, inline."""
        return self.stats.skipped, self._seam

    def on(
        self, seams: SeamRegistry, key: Seam[Fn], listener: Fn, facets: Facets[Any] = NO_FACETS,
        each: Callable[[Sequence[Any]], object] | None = None,
    ) -> Callable[[], None]:  # fmt: skip
        """Register `listener` on `key` as this subscription's; returns the disposer.

        Its agent conditions go with it (`agent_filter`): an agent they exclude has its
        dispatches routed past the listener, and each is counted skipped all the same;
        so do its tool-name and event-kind conditions over the `facets` a dispatch names
        ahead (`facet_filter`). `each` is the listener over a run of inputs
        (`SeamRegistry.emit_each`).
        """
        return seams.on(
            key, listener, order=self.order, name=self.plugin, origin=self.origin,
            applies=agent_filter(self.subscription, self.labels_of), skip=self.skip_count,
            wants=facet_filter(self.subscription, facets), each=each,
        )  # fmt: skip

    async def ask(
        self, at: Located, fill: Fill[In], input: In, read: Read[R], seconds: float | None = None
    ) -> R | None:
        """Call the plugin with `input`; its decision, or None ("continue unchanged").

        None too when a FAIL_OPEN failure skipped it (a FAIL_CLOSED one raises
        `TurnFatal`), and when the plugin only watches the seam (`observe_only`): then
        the call goes as a notification and the loop goes on at once. At an approver
        a failure, a timeout or the approval's end (`Aborted`) only abstains (None).
        `seconds` replaces the subscription's timeout for this call.
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
        if seconds is None:
            seconds = self.timeout
            call.timeout.CopyFrom(self._deadline)
        else:
            call.timeout.FromNanoseconds(int(seconds * 1e9))
        approver = spec.mode == hk.SEAM_MODE_APPROVER
        # An approver's call has never carried the trace context: kept so (no change).
        carrier = None if approver else call
        try:
            with observe.plugin_call_scope(self.plugin, spec.path, agent_id, turn, step, carrier):
                result = await self.caller.call(call, seconds, at.signal)
            if checked(result, spec.payload) is None:
                return None
        except PluginCallFailed as failure:
            self.stats.errors += failure.kind != "timeout"
            if approver:
                log.warning(
                    'plugin "%s" failed at %s (%s: %s); it abstains',
                    self.plugin, spec.path, failure.kind, failure,
                )  # fmt: skip
                return None
            self._failed(failure, agent_id, turn, step)  # or raises `TurnFatal`
            return None
        except Aborted:
            if approver:
                return None  # the approval ended otherwise
            raise
        return read(result)

    def _failed(self, failure: PluginCallFailed, agent_id: str, turn: int, step: int) -> None:
        """Skip the call (FAIL_OPEN: counted, logged) or fail the turn (FAIL_CLOSED)."""
        path = self._spec.path
        if self.subscription.failure_policy != hk.FAILURE_POLICY_FAIL_OPEN:
            raise TurnFatal(
                f'plugin "{self.plugin}" failed at {path}: {failure.kind}: {failure}',
                f"PLUGIN_{failure.kind.upper()}",
            ) from None
        self.stats.fail_opens += 1
        _fail_open_log.log(
            logging.WARNING, (self.plugin, path),
            'plugin "%s" failed at %s (%s: %s); skipped (fail-open)',
            self.plugin, path, failure.kind, failure,
            extra=logs.fields(plugin=self.plugin, seam=path, agent=agent_id, turn=turn, step=step),
        )  # fmt: skip

    def notice(self, agent_id: str) -> hk.HookCall:
        """A notification of this subscription; the caller fills its payload in place."""
        return _HookCall(
            call_id=f"n{next(call_ids)}",
            kind=_NOTIFICATION,
            seam=self._seam,
            agent_id=agent_id,
            session_id=self.session_of(agent_id),
        )
