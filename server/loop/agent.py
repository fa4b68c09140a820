"""An agent: its session, its inbox, its status, and the verbs callers use on it.

The verbs (send, steer, inject, cancel, when_idle) are synchronous or cheap; the work
happens in the driver (`server.loop.driver`), one task per agent for its whole life.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from server.kernel import seams as S
from server.kernel.abort import NEVER, AbortSignal
from server.kernel.content import resolve_source
from server.kernel.errors import AgentDisposed, CodedError, FailedPrecondition
from server.kernel.routes import OTHER_FACET
from server.kernel.tasks import TaskGroup
from server.loop.approvals import Approvals
from server.loop.context import policy_of
from server.loop.inbox import Inbox, QueuedMessage
from server.loop.running import LoopState, Step
from server.loop.runtime import Runtime
from server.observability.logs import fields
from server.sessions.session import SessionLog, now_timestamp
from server.stores import INBOX_CONTEXT, INBOX_MESSAGE, INBOX_STEERING, InboxEntry

log = logging.getLogger(__name__)

In = TypeVar("In")

LiveListener = Callable[[ae.AgentEvent], None]

STATUS_NAMES = {
    ae.AGENT_STATUS_IDLE: "idle",
    ae.AGENT_STATUS_RUNNING: "running",
    ae.AGENT_STATUS_DISPOSED: "disposed",
}


class Agent:
    """One live agent driving one session."""

    def __init__(
        self,
        agent_id: str,
        session: SessionLog,
        options: agent_pb2.AgentOptions,
        runtime: Runtime,
    ) -> None:
        self.agent_id = agent_id
        self.session = session
        self.options = options
        self.runtime = runtime
        self.max_parallel_tool_calls = (
            options.max_parallel_tool_calls
            if options.HasField("max_parallel_tool_calls")
            else runtime.max_parallel_tool_calls
        )
        self.enabled_tools = frozenset(options.tools)
        self.labels = dict(options.labels)
        """`options.labels` as a dict: plugins' conditions read it on every call."""
        self.resolved_provider = options.provider or runtime.default_provider
        """The provider of the first request: the option, else the server default."""
        self.resolved_model = options.model or runtime.models.default_model(self.resolved_provider)
        """The model of the first request: the option, else the provider's default."""
        self.context = policy_of(options, runtime, self.resolved_provider, self.resolved_model)
        """The context window and compaction thresholds (`server.loop.context`)."""
        self.status: ae.AgentStatus.ValueType = ae.AGENT_STATUS_IDLE
        self.inbox = Inbox()
        self.create_time = now_timestamp()
        self.published = False
        self.disposed = False
        self.loop = LoopState()
        """What the driver keeps across turns, and the running turn and step."""
        self.tasks = TaskGroup(f"agent:{agent_id}")
        """Every task of this agent: its driver, tool calls of the rolling pool, approval
        asks, background flushes. Disposal ends the turn, then closes the group."""
        self.driver: asyncio.Task[None] | None = None
        """The driver (`server.loop.driver`), a task of `tasks`."""
        self.teardown: asyncio.Future[None] | None = None
        """The one teardown of this agent, once disposal began."""
        self.pending_flushes: set[asyncio.Task[None]] = set()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._live: list[LiveListener] = []
        self._kinds_noted = -1
        """The `SeamRegistry.version` whose stored-event observers' kinds the session
        notes (`_observe_committed`); -1: none yet."""
        self._kinds_known = False
        """Whether those observers want only some kinds, known: the session notes them."""
        self.approvals = Approvals(
            agent_id,
            session,
            runtime.seams,
            lambda event: self.emit(None, None, event),
            options.approval_timeout.ToNanoseconds() / 1e9
            if options.HasField("approval_timeout")
            else runtime.approval_timeout,
            spawn=self.tasks.start,
        )
        """Tool calls waiting for approval, and those resolved lately."""
        session.observers.append(self._observe_session)
        session.committed_batches.append(self._observe_committed)

    # -- verbs -------------------------------------------------------------------------

    def send(
        self,
        content: Sequence[c.ContentBlock],
        source: c.Source | None = None,
        request_id: str = "",
    ) -> QueuedMessage:
        """Queue a message for the next turn (durable with the next commit)."""
        self._check_live()
        item = self._accept(content, source, request_id, steering=False)
        self.inbox.enqueue(item)
        self._emit_queued(item)
        return item

    def steer(
        self,
        content: Sequence[c.ContentBlock],
        source: c.Source | None = None,
        request_id: str = "",
    ) -> bool:
        """Steer the running turn; when not running, exactly `send`. True if it steered."""
        self._check_live()
        if self.status != ae.AGENT_STATUS_RUNNING:
            self.send(content, source, request_id)
            return False
        item = self._accept(content, source, request_id, steering=True)
        self.inbox.steer(item)
        self._emit_queued(item)
        return True

    def inject(self, context: d.HookContext, request_id: str = "") -> None:
        """Add context: to the open turn (deferred during a tool batch), or as an idle turn."""
        self._check_live()
        message = context_message(context)
        message.request_id = request_id
        step = self._step()
        if self.session.open_turn and step is not None and step.tool_batch_active:
            entry = self.session.accept(INBOX_CONTEXT, message)
            step.deferred.append((message, (entry.entry_id,)))
        elif self.session.open_turn:
            self.session.add(message)
        else:
            self._injection_turn(message, ())

    def cancel(self, reason: str = "") -> tuple[bool, int]:
        """Cancel the running turn and drop queued work.

        Returns whether there was work to cancel and how many messages were dropped
        (each recorded as `message/dropped`).
        """
        reason = reason or "cancelled"
        has_work = (
            self.status == ae.AGENT_STATUS_RUNNING
            or self._step() is not None
            or bool(self.inbox.queued)
            or bool(self.inbox.steering)
        )
        turn = self.loop.turn
        if has_work and turn is not None:
            turn.scope.mark(reason)
        elif has_work:  # no turn yet: the next one takes the marker over (or none starts)
            self.loop.cancel_reason = reason
        dropped = [*self.inbox.drain_queued(), *self.inbox.drain_steering()]
        self.record_dropped(dropped, f"cancelled: {reason}", abort_reason=reason)
        if turn is not None:
            turn.cancel(reason)
        return has_work, len(dropped)

    def record_dropped(
        self, items: Sequence[QueuedMessage], reason: str, *, abort_reason: str = ""
    ) -> None:
        """Record accepted messages that no turn will answer, inside a turn.

        In the open turn if there is one; else in a zero-step turn that ends
        `aborted` with `abort_reason`, so that the drop is part of the turn log.
        """
        items = [item for item in items if item.entry_id]  # continuation reasons: not accepted
        if not items:
            return
        opened = 0
        if not self.session.open_turn:
            opened = self.session.max_turn + 1
            self.session.add(
                ev.TurnStart(turn=opened, trigger=ev.TRIGGER_KIND_MESSAGE, source=items[0].source),
            )
        for item in items:
            self.session.add(
                ev.MessageDropped(
                    content=item.content,
                    source=item.source,
                    reason=reason,
                    request_id=item.request_id,
                    steering=item.steering,
                ),
                consumes=item.consumes,
            )
        if opened:
            self.session.add(
                ev.TurnEnd(
                    turn=opened,
                    reason=ev.TurnEndReason(
                        aborted=ev.TurnAborted(reason=abort_reason or "cancelled")
                    ),
                ),
            )

    def restore(self, entries: Sequence[InboxEntry]) -> None:
        """Take up what the durable inbox held when the session was loaded, in order.

        Messages and steering queue for the next turn (steering that missed its turn
        becomes a prompt); a context becomes a one-shot injection turn.
        """
        for entry in entries:
            message = entry.message
            if entry.kind == INBOX_CONTEXT:
                assert isinstance(message, ev.ContextMessage)
                self._injection_turn(message, (entry.entry_id,))
                continue
            item = QueuedMessage(
                list(message.content),
                message.source,
                entry.entry_id,
                message.request_id,
                steering=entry.kind == INBOX_STEERING,
            )
            self.inbox.enqueue(item)
            self._emit_queued(item)

    def is_idle(self) -> bool:
        """Whether nothing runs and nothing is queued (a disposed agent counts as idle)."""
        if self.disposed:
            return self.driver is None or self.driver.done()
        return self.status != ae.AGENT_STATUS_RUNNING and not self.inbox.queued

    async def when_idle(self) -> None:
        """Return when nothing runs and nothing is queued (or the agent is disposed)."""
        if self.disposed:
            if self.driver is not None:
                await asyncio.shield(self.driver)
            return
        if self.status != ae.AGENT_STATUS_RUNNING and not self.inbox.queued:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._idle_waiters:  # timed out or cancelled: do not keep it
                self._idle_waiters.remove(waiter)
        if self.disposed and self.driver is not None:
            await asyncio.shield(self.driver)  # disposal settles at once; the turn closes later

    def subscribe(self, listener: LiveListener) -> Callable[[], None]:
        """Receive the live agent events; returns a remover."""
        self._live.append(listener)
        return lambda: self._live.remove(listener) if listener in self._live else None

    # -- driver-facing -----------------------------------------------------------------

    def turn_signal(self) -> AbortSignal:
        """The running turn's signal (a never-firing one outside a turn)."""
        turn = self.loop.turn
        return turn.signal if turn is not None else NEVER

    def step_signal(self) -> AbortSignal:
        """The current step's signal (a never-firing one outside a step)."""
        step = self._step()
        return step.signal if step is not None else NEVER

    def set_status(self, status: ae.AgentStatus.ValueType) -> None:
        """Move to `status`, emitting `agent/status` on a real transition only."""
        if status == self.status or self.status == ae.AGENT_STATUS_DISPOSED:
            return
        self.status = status
        if status == ae.AGENT_STATUS_IDLE:
            self.settle_idle()
        if status == ae.AGENT_STATUS_DISPOSED and not self.published:
            return
        if self._unheard(S.STATUS, "status"):
            return  # nobody to tell: build neither the seam's input nor the event
        self.emit(
            S.STATUS,
            S.StatusChanged(self, STATUS_NAMES[status]),
            ae.AgentEvent(status=ae.AgentStatusChanged(status=status)),
        )

    def settle_idle(self) -> None:
        """Release the `when_idle` waiters."""
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def report_error(self, turn: int, step: int, error: BaseException) -> None:
        """Emit `agent/error` for a failure of turn `turn` at step `step`."""
        code = error.code if isinstance(error, CodedError) else ""
        log.warning(
            "agent %s turn %d step %d failed: %s", self.agent_id, turn, step, error,
            extra=fields(
                agent=self.agent_id, session=self.session.session_id, turn=turn, step=step
            ),
        )  # fmt: skip
        self.emit(
            S.ERROR,
            S.AgentFailed(self, turn, step, error),
            ae.AgentEvent(error=ae.AgentError(turn=turn, step=step, message=str(error), code=code)),
        )

    def emit(self, seam: S.Emit[In] | None, input: In, event: ae.AgentEvent) -> None:
        """Notify the seam's listeners (if any seam) and the live subscribers; contained.

        The seam's in-process listeners run now; the live subscribers and the
        `agent/event` observers only once everything written before is stored, so
        that no notification overtakes the log it refers to.
        """
        seams = self.runtime.seams
        if seam is not None:
            seams.emit(seam, self.agent_id, input)
        kind = None
        if not self._live:  # the observers alone: routed by kind, asked (and counted) now
            if S.AGENT_EVENT not in seams.heard:
                return
            kind = event.WhichOneof("event")
            if not seams.has(S.AGENT_EVENT, self.agent_id, kind):
                return
        event.agent_id = self.agent_id
        event.create_time.CopyFrom(now_timestamp())
        self.session.after_commit(lambda: self._notify(event, kind))

    def _notify(self, event: ae.AgentEvent, kind: str | None) -> None:
        for listener in list(self._live):
            try:
                listener(event)
            except Exception:
                log.warning("live agent event listener failed", exc_info=True)
        seams = self.runtime.seams
        if S.AGENT_EVENT in seams.heard:  # routed by kind: those not wanted build no input
            if kind is None:
                kind = event.WhichOneof("event")
            if seams.has(S.AGENT_EVENT, self.agent_id, kind):
                seams.emit(S.AGENT_EVENT, self.agent_id, S.AgentEventSeen(self, event), kind)

    def _observe_session(self, event: ev.SessionEvent) -> None:
        """Pass each appended event to the in-process `session/event` observers."""
        seams = self.runtime.seams
        if S.SESSION_EVENT in seams.heard and seams.has(S.SESSION_EVENT, self.agent_id):
            seams.emit(S.SESSION_EVENT, self.agent_id, S.SessionEventSeen(self, event))

    def _observe_committed(self, events: Sequence[ev.SessionEvent]) -> None:
        """Pass each run of stored events to the `session/committed` observers (plugins)."""
        seams = self.runtime.seams
        if S.SESSION_COMMITTED not in seams.heard:
            return
        if self._kinds_noted != seams.version:  # the observers changed: note what they want
            self._kinds_noted = seams.version
            kinds = seams.wanted(S.SESSION_COMMITTED, self.agent_id)
            self.session.note_kinds(kinds)
            self._kinds_known = kinds is not None
        facet = None
        if self._kinds_known and self.session.none_noted_from(events[0].seq):  # none wanted
            if not seams.has(S.SESSION_COMMITTED, self.agent_id, OTHER_FACET, len(events)):
                return  # each event counted skipped by each observer, none read
            facet = OTHER_FACET
        # One route for the run, not one per event.
        seams.emit_each(S.SESSION_COMMITTED, self.agent_id, S.SessionEventRun(self, events), facet)

    def stop(self) -> None:
        """First step of disposal: mark disposed, unpark the driver, cancel the running turn."""
        if self.disposed:
            return
        self.disposed = True
        self.inbox.wake()
        self.settle_idle()
        if self.loop.turn is not None:
            self.loop.turn.cancel("disposed")
        self.set_status(ae.AGENT_STATUS_DISPOSED)

    def track_flush(self, turn: int) -> None:
        """Flush in the background (an idle injection); tracked so disposal drains it."""

        async def flush() -> None:
            try:
                await self.runtime.persistence.flush(self.session)
            except Exception as error:  # reported, never raised: nobody awaits this
                self.report_error(turn, 0, error)

        task = self.tasks.start(flush(), name=f"agent:{self.agent_id}:flush")
        self.pending_flushes.add(task)
        task.add_done_callback(self.pending_flushes.discard)

    # -- internals ---------------------------------------------------------------------

    def _step(self) -> Step | None:
        turn = self.loop.turn
        return turn.current if turn is not None else None

    def _check_live(self) -> None:
        if self.disposed:
            raise AgentDisposed(self.agent_id)
        if not self.published:  # creation still awaits the store: nothing may queue yet
            raise FailedPrecondition(f'agent "{self.agent_id}" is still being created')
        if self.session.failure is not None:  # its writes are refused: it is stopping
            raise FailedPrecondition(f'agent "{self.agent_id}" stopped: {self.session.failure}')

    def _accept(
        self,
        content: Sequence[c.ContentBlock],
        source: c.Source | None,
        request_id: str,
        *,
        steering: bool,
    ) -> QueuedMessage:
        """Record a message in the durable inbox; the item that mirrors it in memory."""
        message = ev.UserMessage(
            content=content, source=resolve_source(source), request_id=request_id
        )
        kind = INBOX_STEERING if steering else INBOX_MESSAGE
        entry = self.session.accept(kind, message)
        return QueuedMessage(
            list(message.content), message.source, entry.entry_id, request_id, steering=steering
        )

    def _unheard(self, seam: S.SeamKey, kind: str) -> bool:
        """Whether a notification on `seam` of agent-event `kind` has nobody to tell.

        Nobody: no live subscriber, no listener of `seam`, no `agent/event` observer
        that wants `kind` (each that sits it out is counted now). It then builds nothing.
        """
        if self._live:
            return False
        seams = self.runtime.seams
        heard = seams.heard
        if seam in heard:
            return False
        return S.AGENT_EVENT not in heard or not seams.has(S.AGENT_EVENT, self.agent_id, kind)

    def _emit_queued(self, item: QueuedMessage) -> None:
        if self._unheard(S.QUEUED, "queued"):
            return  # nobody to tell: build neither the seam's input nor the event
        self.emit(
            S.QUEUED,
            S.Queued(self, item.content, item.source, item.steering),
            ae.AgentEvent(
                queued=ae.AgentQueued(
                    content=item.content,
                    source=item.source,
                    steering=item.steering,
                    request_id=item.request_id,
                )
            ),
        )

    def _injection_turn(self, message: ev.ContextMessage, consumes: tuple[int, ...]) -> None:
        """The one-shot turn of an idle injection: turn/start, context, turn/end."""
        turn = self.session.max_turn + 1
        self.session.add(
            ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_INJECTION, source=message.source),
        )
        try:
            self.session.add(message, consumes=consumes)
        finally:
            self.session.add(
                ev.TurnEnd(turn=turn, reason=ev.TurnEndReason(completed=ev.TurnCompleted())),
            )
            self.track_flush(turn)


def context_message(context: d.HookContext) -> ev.ContextMessage:
    """The `context/message` payload of a hook context, with defaults applied."""
    message = ev.ContextMessage(
        content=context.content,
        source=context.source if context.source.kind else c.Source(kind="user"),
        envelope=context.envelope or ev.CONTEXT_ENVELOPE_CONTEXT,
    )
    if context.HasField("meta"):
        message.meta.CopyFrom(context.meta)
    return message
