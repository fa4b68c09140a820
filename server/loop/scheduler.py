"""The tool-batch scheduler: exclusive barriers, a rolling parallel pool, model-order commits.

Calls are scanned in model order and each is classified just before it starts, so
a registry change made by an earlier call (or by a `tools/result` observer) counts.
An exclusive call is a barrier: the pool drains, it runs alone, and it commits
before the next call starts. Consecutive parallel calls share a rolling pool of at
most `max_parallel` dispatches. Only dispatch overlaps: every prepare and every
finalize runs on the scheduler's own task, one at a time, so pre-execute and
post-execute listeners see the calls in model order. A call held for approval waits
in its own slot (a dispatch of the pool, or inline when exclusive): the others go on,
and its result still commits in model order.

A result marked `fatal` (a FAIL_CLOSED plugin failed) stops the batch: calls not yet
started are neither logged nor run, those started are committed, then the failure
is raised so that the turn ends `error`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from agentloop.v1 import content_pb2, decision_pb2
from server.kernel import tasks
from server.kernel.abort import AbortSignal
from server.kernel.errors import Aborted, CodedError
from server.kernel.seams import SeamRegistry
from server.kernel.tasks import Spawn, cancel_and_wait
from server.kernel.tools import ToolExecution, ToolOutcome, ToolRegistry
from server.loop.approvals import Approvals, PendingApproval
from server.loop.tool_pipeline import ToolPipeline, failure_outcome

DEFAULT_MAX_PARALLEL = 10
"""The server's default cap on parallel dispatches per batch."""

OnCall = Callable[[content_pb2.ToolCallBlock], int]
OnResult = Callable[[ToolExecution, ToolOutcome, int], None]
OnContext = Callable[[decision_pb2.HookContext], None]
BeforeDispatch = Callable[[], Awaitable[None]]


async def run_tool_batch(
    calls: Sequence[content_pb2.ToolCallBlock],
    *,
    registry: ToolRegistry,
    seams: SeamRegistry,
    agent_id: str,
    enabled: Collection[str],
    turn: int,
    step: int,
    signal: AbortSignal,
    max_parallel: int,
    on_call: OnCall,
    on_result: OnResult,
    on_context: OnContext,
    before_dispatch: BeforeDispatch | None = None,
    approvals: Approvals | None = None,
    approval_required: Collection[str] = (),
    spawn: Spawn = tasks.spawn,
) -> None:
    """Run one step's tool calls and commit their results in model order.

    Args:
        calls: the model's tool calls, in model order.
        registry: the tools and guards.
        seams: the `tools/*` listeners.
        agent_id: the calling agent.
        enabled: the built-in tools the agent enabled.
        turn: the turn number.
        step: the step number.
        signal: the step's abort signal.
        max_parallel: the most dispatches in flight at once; 1 is serial.
        on_call: called just before a call's prepare stage; returns the seq of
            its `tool/call` event.
        on_result: called with each call's execution, its result and the seq of its
            `tool/call`, in model order.
        on_context: called with each committed result's contexts, in model order.
        before_dispatch: awaited before each dispatch (the tool's side effects):
            the loop waits there until the call's `tool/call` is stored.
        approvals: the agent's approvals; None denies every ask.
        approval_required: tools that always need approval.
        spawn: starts a dispatch of the rolling pool (the agent's task group).

    Raises:
        ValueError: `max_parallel` is not a positive integer.
        Aborted: the signal fired; calls that started were committed first, and
            calls that had not started were neither logged nor run.
        TurnFatal: a call's failure ends the turn (same commit rule as Aborted).
    """
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise ValueError("maxParallelToolCalls must be a positive integer")
    batch = _Batch(
        ToolPipeline(registry, seams, agent_id, enabled, approvals, approval_required),
        signal,
        max_parallel,
        on_call,
        on_result,
        on_context,
        before_dispatch,
        spawn,
    )
    pending = [
        (call, ToolExecution.of(call, agent_id=agent_id, turn=turn, step=step, signal=signal))
        for call in calls
    ]
    await batch.run(pending)
    if batch.fatal is not None:
        raise batch.fatal
    signal.raise_if_aborted()


@dataclass(eq=False)
class _Slot:
    """A started call, waiting for its turn to commit."""

    call: content_pb2.ToolCallBlock
    exec: ToolExecution
    seq: int
    outcome: ToolOutcome | None = None
    task: asyncio.Future[ToolOutcome] | None = None

    def settled(self) -> ToolOutcome | None:
        """The call's result once it has one."""
        if self.outcome is None and self.task is not None and self.task.done():
            self.outcome = self.task.result()
        return self.outcome


class _Batch:
    """The state of one batch: started calls, the commit cursor and the pool."""

    def __init__(
        self,
        pipeline: ToolPipeline,
        signal: AbortSignal,
        max_parallel: int,
        on_call: OnCall,
        on_result: OnResult,
        on_context: OnContext,
        before_dispatch: BeforeDispatch | None,
        spawn: Spawn,
    ) -> None:
        self._pipeline = pipeline
        self._spawn = spawn
        self._before_dispatch = before_dispatch
        self._signal = signal
        self._max_parallel = max_parallel
        self._on_call = on_call
        self._on_result = on_result
        self._on_context = on_context
        self._slots: list[_Slot] = []
        self._cursor = 0
        self._in_flight: set[asyncio.Future[ToolOutcome]] = set()
        self.fatal: CodedError | None = None
        """The first failure that ends the turn; no call starts after it."""

    async def run(self, pending: list[tuple[content_pb2.ToolCallBlock, ToolExecution]]) -> None:
        """Start what may start, then commit everything that started."""
        try:
            await self._schedule(pending)
            await self._drain()
        finally:
            # Only when a callback or the caller failed us: leave no orphan dispatch.
            await cancel_and_wait(self._in_flight)

    async def _schedule(
        self, pending: list[tuple[content_pb2.ToolCallBlock, ToolExecution]]
    ) -> None:
        index = 0
        while index < len(pending):
            # Commit first: a `tools/result` observer may change how the next call runs.
            await self._commit_ready()
            if self._signal.aborted or self.fatal is not None:
                return
            call, exec = pending[index]
            if self._pipeline.execution_mode(exec) == "exclusive":
                if self._cursor < len(self._slots):
                    await self._settle_one()
                    continue
                await self._start(call, exec, inline=True)
            else:
                if len(self._in_flight) >= self._max_parallel:
                    await self._settle_one()
                    continue
                await self._start(call, exec, inline=False)
            index += 1

    async def _start(
        self, call: content_pb2.ToolCallBlock, exec: ToolExecution, *, inline: bool
    ) -> None:
        slot = _Slot(call, exec, self._on_call(call))
        self._slots.append(slot)
        prepared = await self._pipeline.prepare(exec)
        if isinstance(prepared, ToolOutcome):
            slot.outcome = prepared
            if prepared.fatal is not None and self.fatal is None:
                self.fatal = prepared.fatal
            return  # denied or failed: nothing to dispatch
        if inline:
            slot.outcome = await self._approve_then_dispatch(exec, prepared)
        else:
            slot.task = self._spawn(self._approve_then_dispatch(exec, prepared))
            self._in_flight.add(slot.task)

    async def _approve_then_dispatch(
        self, exec: ToolExecution, pending: PendingApproval | None
    ) -> ToolOutcome:
        if pending is not None:
            denied = await self._pipeline.approve(exec, pending)
            if denied is not None:
                return denied
        return await self._dispatch(exec)

    async def _dispatch(self, exec: ToolExecution) -> ToolOutcome:
        # Calls started in one tick wait for the same commit: one write for the pool.
        if self._before_dispatch is not None:
            try:
                await self._before_dispatch()
            except Exception as error:  # the call was never stored: it must not run
                return failure_outcome(error, final=True)
            if exec.signal.aborted:  # cancelled while the commit was written
                return failure_outcome(Aborted(exec.signal.reason), final=True)
        return await self._pipeline.dispatch(exec)

    async def _settle_one(self) -> None:
        await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)
        self._in_flight = {task for task in self._in_flight if not task.done()}

    async def _commit_ready(self) -> None:
        while self._cursor < len(self._slots):
            slot = self._slots[self._cursor]
            outcome = slot.settled()
            if outcome is None:
                return  # a later result waits behind an earlier one
            outcome = await self._pipeline.finalize(slot.exec, outcome)
            if outcome.fatal is not None and self.fatal is None:
                self.fatal = outcome.fatal
            self._cursor += 1
            self._on_result(slot.exec, outcome, slot.seq)
            for context in outcome.contexts:
                self._on_context(context)

    async def _drain(self) -> None:
        await self._commit_ready()
        while self._cursor < len(self._slots):
            await self._settle_one()
            await self._commit_ready()
