"""Human approval of tool calls: the step between `tools/pre-execute` and the guards.

When the pre-execute decision is `ask` (or the agent's `approval_required_tools` names
the tool), the call is held: an `approval/requested` event is appended, and the call
waits, holding only its own slot of the batch, until one of:

- an answer, from `ResolveApproval` or from an approver plugin (the `tools/approval`
  seam), whichever comes first: `allowed-once` runs the call (its guards still apply),
  `rejected` denies it with `the user rejected tool "X"` (then `: <reason>`);
- the step's abort signal (a cancel, a disposal): `cancelled`, denied with
  `approval for tool "X" was cancelled`;
- the approval timeout: denied with `approval for tool "X" timed out after N seconds`.

Each ends with one `approval/resolved` event saying who answered and how, written
ahead like every event. With approvals turned off (a timeout of 0) an ask is denied
at once: `tool "X" requires approval (no approval channel is available)`. An
approval whose turn a crash interrupted has no `approval/resolved`: it was never
answered, and the reload closes its turn as `interrupted`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_pb2
from agentloop.v1 import approval_pb2 as ap
from server.kernel import seams as S
from server.kernel import tasks
from server.kernel.abort import AbortController, AbortSignal
from server.kernel.errors import FailedPrecondition, InvalidArgument, NotFound
from server.kernel.seams import SeamRegistry
from server.kernel.tasks import Spawn
from server.kernel.tools import ToolExecution
from server.sessions.session import SessionLog
from server.stores import FIRST_SEQ

log = logging.getLogger(__name__)

DEFAULT_APPROVAL_TIMEOUT = 300.0
"""Seconds a call waits for approval when neither the agent nor the server set it."""

MAX_APPROVAL_TIMEOUT = 24 * 3600.0
"""The longest approval timeout an agent may set."""

MAX_REASON_BYTES = 4096
"""The longest rejection reason ResolveApproval takes."""

BY_POLICY = "options.approval_required_tools"
"""`requested_by` of an approval the agent's own policy asked for."""

BY_LISTENER = "tools/pre-execute"
"""`requested_by` of an approval an in-process pre-execute listener asked for (a plugin's
listener asks as its registration's `origin`, `plugin:NAME`)."""

BY_API = "api"
BY_SERVER = "server"

REMEMBERED = 1000
"""Resolved approvals remembered per agent for precise refusals (older: read the log)."""

Approver = S.GatherListener[S.ApprovalAsk, S.ApprovalAnswer]
"""A `tools/approval` listener: `fn(ask)` -> (decision, reason) or None (abstains)."""


def rejected_text(name: str, reason: str = "") -> str:
    """The denial of a rejected call."""
    text = f'the user rejected tool "{name}"'
    return f"{text}: {reason}" if reason else text


def cancelled_text(name: str) -> str:
    """The denial of a cancelled approval."""
    return f'approval for tool "{name}" was cancelled'


def timed_out_text(name: str, seconds: float) -> str:
    """The denial of an approval nobody answered in time."""
    return f'approval for tool "{name}" timed out after {seconds:g} seconds'


def unavailable_text(name: str) -> str:
    """The denial of an ask when approvals are turned off."""
    return f'tool "{name}" requires approval (no approval channel is available)'


def check_approval_options(options: agent_pb2.AgentOptions) -> None:
    """Refuse an approval timeout out of range, or an empty tool name."""
    for i, name in enumerate(options.approval_required_tools):
        if not name:
            raise InvalidArgument(f"options.approval_required_tools[{i}]", "must not be empty")
    if options.HasField("approval_timeout"):
        timeout = options.approval_timeout
        seconds = timeout.ToNanoseconds() / 1e9
        if timeout.nanos < 0 or timeout.seconds < 0 or seconds <= 0:
            raise InvalidArgument("options.approval_timeout", "must be positive")
        if seconds > MAX_APPROVAL_TIMEOUT:
            raise InvalidArgument("options.approval_timeout", "must be at most 24 hours")


class ApprovalNotFound(NotFound):
    """No approval of the agent has this id."""

    reason = "APPROVAL_NOT_FOUND"

    def __init__(self, agent_id: str, approval_id: str) -> None:
        super().__init__(
            f'agent "{agent_id}" has no approval "{approval_id}"',
            agent_id=agent_id,
            approval_id=approval_id,
        )


class ApprovalResolved(FailedPrecondition):
    """The approval already ended: answered, cancelled or timed out."""

    reason = "APPROVAL_RESOLVED"

    def __init__(self, agent_id: str, resolved: ap.ApprovalResolved) -> None:
        outcome = ap.ApprovalOutcome.Name(resolved.outcome)
        super().__init__(
            f'approval "{resolved.approval_id}" was already resolved: {outcome}'
            f" by {resolved.resolved_by}",
            agent_id=agent_id,
            approval_id=resolved.approval_id,
            outcome=outcome,
            resolved_by=resolved.resolved_by,
        )
        self.resolved = resolved


class ApprovalStale(FailedPrecondition):
    """The approval's turn ended (a crash interrupted it) and it was never answered."""

    reason = "APPROVAL_STALE"

    def __init__(self, agent_id: str, approval_id: str) -> None:
        super().__init__(
            f'approval "{approval_id}" was never answered and its turn has ended',
            agent_id=agent_id,
            approval_id=approval_id,
        )


@dataclass(eq=False)
class PendingApproval:
    """One call waiting for approval."""

    request: ap.ApprovalRequested
    timeout: float
    future: asyncio.Future[ap.ApprovalResolved]
    approvers: AbortController = field(default_factory=AbortController)
    """Fires when the approval ends: withdraws the approver plugins' calls."""
    tasks: set[asyncio.Future[None]] = field(default_factory=set)


class Approvals:
    """The approvals of one agent: pending ones, and those resolved lately."""

    def __init__(
        self,
        agent_id: str,
        session: SessionLog,
        seams: SeamRegistry,
        notify: Callable[[ae.AgentEvent], None],
        timeout: float,
        *,
        spawn: Spawn | None = None,
    ) -> None:
        self.agent_id = agent_id
        self._spawn: Spawn = spawn or tasks.spawn
        """Starts an approver's ask: a task of the agent's group."""
        self.session = session
        self.seams = seams
        self.notify = notify
        self.timeout = timeout
        """Seconds a call waits; 0 turns approvals off (an ask is then a denial)."""
        self.pending: dict[str, PendingApproval] = {}
        self._resolved: OrderedDict[str, ap.ApprovalResolved] = OrderedDict()

    @property
    def available(self) -> bool:
        """Whether an ask can wait for an answer."""
        return self.timeout > 0

    def list(self) -> list[ap.ApprovalRequested]:
        """The pending approvals, oldest first."""
        return [p.request for p in self.pending.values()]

    def open(self, exec: ToolExecution, reason: str, requested_by: str) -> PendingApproval:
        """Record the request (`approval/requested`) and hold the call; synchronous."""
        expire = time.time_ns() + int(self.timeout * 1e9)
        request = ap.ApprovalRequested(
            turn=exec.turn,
            step=exec.step,
            approval_id=f"ap-{uuid.uuid4().hex[:16]}",
            call_id=exec.call_id,
            tool_name=exec.name,
            arguments=exec.raw_arguments,
            reason=reason,
            requested_by=requested_by,
        )
        request.expire_time.FromNanoseconds(expire)
        self.session.add(request)
        pending = PendingApproval(request, self.timeout, asyncio.get_running_loop().create_future())
        self.pending[request.approval_id] = pending
        self.notify(ae.AgentEvent(approval_requested=request))
        if self.seams.has(S.TOOLS_APPROVAL, self.agent_id, request.tool_name):  # stored first
            self.session.after_commit(lambda: self._ask_approvers(pending))
        return pending

    async def wait(self, pending: PendingApproval, signal: AbortSignal) -> str | None:
        """Wait for the answer; None to run the call, else the denial text."""
        request = pending.request

        def cancel(why: str) -> None:
            self._finish(pending, ap.APPROVAL_OUTCOME_CANCELLED, why, BY_SERVER)

        remove = signal.on_abort(cancel)
        try:
            resolved = await asyncio.wait_for(asyncio.shield(pending.future), pending.timeout)
        except TimeoutError:
            resolved = self._finish(pending, ap.APPROVAL_OUTCOME_TIMED_OUT, "", BY_SERVER)
        finally:
            remove()
            if not pending.future.done():  # our task was cancelled: nobody waits any more
                self._finish(pending, ap.APPROVAL_OUTCOME_CANCELLED, "cancelled", BY_SERVER)
        name = request.tool_name
        if resolved.outcome == ap.APPROVAL_OUTCOME_ALLOWED_ONCE:
            return None
        if resolved.outcome == ap.APPROVAL_OUTCOME_REJECTED:
            return rejected_text(name, resolved.reason)
        if resolved.outcome == ap.APPROVAL_OUTCOME_TIMED_OUT:
            return timed_out_text(name, pending.timeout)
        return cancelled_text(name)

    def resolve(
        self,
        approval_id: str,
        decision: ap.ApprovalDecision.ValueType,
        reason: str,
        resolved_by: str,
        request_id: str = "",
    ) -> ap.ApprovalResolved:
        """Answer a pending approval; the first answer wins.

        Raises:
            ApprovalResolved: it already ended (the error says who answered and how).
            ApprovalNotFound: no pending or recently resolved approval has this id
                (the caller may look further in the log: `refusal`).
        """
        pending = self.pending.get(approval_id)
        if pending is None:
            known = self._resolved.get(approval_id)
            if known is not None:
                raise ApprovalResolved(self.agent_id, known)
            raise ApprovalNotFound(self.agent_id, approval_id)
        outcome = (
            ap.APPROVAL_OUTCOME_ALLOWED_ONCE
            if decision == ap.APPROVAL_DECISION_ALLOW_ONCE
            else ap.APPROVAL_OUTCOME_REJECTED
        )
        return self._finish(pending, outcome, reason, resolved_by, request_id)

    async def refusal(self, approval_id: str) -> Exception:
        """Why an approval that is neither pending nor remembered cannot be answered.

        Reads the log: resolved (APPROVAL_RESOLVED), requested but never answered
        (APPROVAL_STALE), or unknown (APPROVAL_NOT_FOUND).
        """
        requested = False
        start = FIRST_SEQ
        while start < self.session.durable:
            events = await self.session.read(start, 5000)
            if not events:
                break
            for event in events:
                kind = event.WhichOneof("payload")
                resolved = event.approval_resolved
                if kind == "approval_resolved" and resolved.approval_id == approval_id:
                    return ApprovalResolved(self.agent_id, resolved)
                if (
                    kind == "approval_requested"
                    and event.approval_requested.approval_id == approval_id
                ):
                    requested = True
            start = events[-1].seq + 1
        if requested:
            return ApprovalStale(self.agent_id, approval_id)
        return ApprovalNotFound(self.agent_id, approval_id)

    def _finish(
        self,
        pending: PendingApproval,
        outcome: ap.ApprovalOutcome.ValueType,
        reason: str,
        resolved_by: str,
        request_id: str = "",
    ) -> ap.ApprovalResolved:
        """End an approval once: its event, its live event, its approvers withdrawn."""
        if pending.future.done():
            return pending.future.result()
        request = pending.request
        resolved = ap.ApprovalResolved(
            turn=request.turn,
            step=request.step,
            approval_id=request.approval_id,
            call_id=request.call_id,
            tool_name=request.tool_name,
            outcome=outcome,
            reason=reason,
            resolved_by=resolved_by,
            request_id=request_id,
        )
        self.pending.pop(request.approval_id, None)
        self._resolved[request.approval_id] = resolved
        while len(self._resolved) > REMEMBERED:
            self._resolved.popitem(last=False)
        pending.future.set_result(resolved)
        if self.session.failure is None:
            self.session.add(resolved)
        self.notify(ae.AgentEvent(approval_resolved=resolved))
        pending.approvers.abort(f"approval already resolved by {resolved_by}")
        return resolved

    def _ask_approvers(self, pending: PendingApproval) -> None:
        """Send the stored request to every `tools/approval` listener of the agent."""
        if pending.future.done():
            return
        tool = pending.request.tool_name
        for registration in self.seams.listeners(S.TOOLS_APPROVAL, self.agent_id, tool):
            task = self._spawn(self._ask(pending, registration.fn, registration.name))
            pending.tasks.add(task)
            task.add_done_callback(pending.tasks.discard)

    async def _ask(self, pending: PendingApproval, approver: Approver, name: str) -> None:
        try:
            answer = approver(
                S.ApprovalAsk(self.agent_id, pending.request, pending.approvers.signal)
            )
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as error:  # an approver that fails abstains
            log.warning(
                "approver %s failed on approval %s: %s",
                name, pending.request.approval_id, error,
            )  # fmt: skip
            return
        if answer is None or pending.future.done():
            return
        decision, reason = answer
        if decision not in (ap.APPROVAL_DECISION_ALLOW_ONCE, ap.APPROVAL_DECISION_REJECT):
            return  # unset: abstains
        self._finish(
            pending,
            ap.APPROVAL_OUTCOME_ALLOWED_ONCE
            if decision == ap.APPROVAL_DECISION_ALLOW_ONCE
            else ap.APPROVAL_OUTCOME_REJECTED,
            reason,
            f"plugin:{name}" if name else "plugin",
        )
