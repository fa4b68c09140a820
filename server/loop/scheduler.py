"""The tool-batch scheduler: exclusive barriers, a rolling parallel pool, model-order commits.

Calls are scanned in model order and each is classified just before it starts, so
a registry change made by an earlier call (or by a `tools/result` observer) counts.
An exclusive call is a barrier: the pool drains, it runs alone, and it commits
before the next call starts. Consecutive parallel calls share a rolling pool of at
most `max_parallel` dispatches; the batch's last call, when nothing else is in flight
(a batch of one call, the common case), runs on the scheduler's task as an exclusive
one does: it would overlap nothing. Only dispatch overlaps: every prepare and every
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
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agentloop.v1 import content_pb2, decision_pb2
from server.kernel import tasks
from server.kernel.abort import AbortSignal
from server.kernel.errors import Aborted, CodedError
from server.kernel.tasks import Spawn, cancel_and_wait
from server.kernel.tools import ToolExecution, ToolOutcome, ToolProgress, no_progress
from server.loop.approvals import PendingApproval
from server.loop.tool_pipeline import ToolPipeline, failure_outcome

DEFAULT_MAX_PARALLEL = 10
"""The server's default cap on parallel dispatches per batch."""


class BatchLog(Protocol):
    """What a batch records of its calls, in model order (the step's session log)."""

    def call(self, call: content_pb2.ToolCallBlock) -> int:
        """Record a call just before its prepare stage; the seq of its `tool/call`."""
        ...

    def result(
        self, exec: ToolExecution, outcome: ToolOutcome, call_seq: int, ran: Ran | None
    ) -> None:
        """Record a call's result (in model order).

        With the seq of its `tool/call`, and when the tool ran (None: it never started).
        """
        ...

    def context(self, context: decision_pb2.HookContext) -> None:
        """Record a context a committed result carried."""
        ...


@dataclass(frozen=True)
class ToolBatch:
    """Everything one step's tool batch runs with."""

    tools: ToolPipeline
    """The per-call stages: guards, seams, approvals, dispatch."""
    agent_id: str
    turn: int
    step: int
    signal: AbortSignal
    """The step's abort signal."""
    max_parallel: int
    """The most dispatches in flight at once; 1 is serial."""
    log: BatchLog
    spawn: Spawn = tasks.spawn
    """Starts a dispatch of the rolling pool (the agent's task group)."""
    before_dispatch: Callable[[], Awaitable[None]] | None = None
    """Awaited before each dispatch (the tool's side effects): the loop waits there until
    the call's `tool/call` is stored."""
    progress: Callable[[content_pb2.ToolCallBlock], Callable[[ToolProgress], None]] | None = None
    """Makes the reporter a call shows its progress with (the agent's live events)."""

    def execution(self, call: content_pb2.ToolCallBlock) -> ToolExecution:
        """The execution of one of the batch's calls."""
        return ToolExecution.of(
            call,
            agent_id=self.agent_id,
            turn=self.turn,
            step=self.step,
            signal=self.signal,
            report_progress=no_progress if self.progress is None else self.progress(call),
        )


async def run_tool_batch(calls: Sequence[content_pb2.ToolCallBlock], batch: ToolBatch) -> None:
    """Run one step's tool calls (in model order) and commit their results in model order.

    Raises:
        ValueError: `max_parallel` is not a positive integer.
        Aborted: the signal fired; calls that started were committed first, and
            calls that had not started were neither logged nor run.
        TurnFatal: a call's failure ends the turn (same commit rule as Aborted).
    """
    max_parallel = batch.max_parallel
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise ValueError("maxParallelToolCalls must be a positive integer")
    signal = batch.signal
    running = _Batch(batch)
    pending = [(call, batch.execution(call)) for call in calls]
    await running.run(pending)
    if running.fatal is not None:
        raise running.fatal
    signal.raise_if_aborted()


@dataclass(frozen=True)
class Ran:
    """When a tool's own body ran, in nanoseconds since the epoch (wall clock)."""

    start_ns: int
    end_ns: int


@dataclass(eq=False)
class _Slot:
    """A started call, waiting for its turn to commit."""

    call: content_pb2.ToolCallBlock
    exec: ToolExecution
    seq: int
    outcome: ToolOutcome | None = None
    task: asyncio.Future[ToolOutcome] | None = None
    ran: Ran | None = None
    """When the tool ran: its result is produced then, committed later in model order."""

    def settled(self) -> ToolOutcome | None:
        """The call's result once it has one."""
        if self.outcome is None and self.task is not None and self.task.done():
            self.outcome = self.task.result()
        return self.outcome


class _Batch:
    """The state of one batch: started calls, the commit cursor and the pool."""

    def __init__(self, batch: ToolBatch) -> None:
        self._pipeline = batch.tools
        self._spawn = batch.spawn
        self._signal = batch.signal
        self._max_parallel = batch.max_parallel
        self._log = batch.log
        self._before_dispatch = batch.before_dispatch
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
                # The pool's last call with nothing else in flight overlaps nothing: it
                # runs on this task, as an exclusive one does (no task, no wait on one).
                alone = not self._in_flight and index == len(pending) - 1
                await self._start(call, exec, inline=alone)
            index += 1

    async def _start(
        self, call: content_pb2.ToolCallBlock, exec: ToolExecution, *, inline: bool
    ) -> None:
        slot = _Slot(call, exec, self._log.call(call))
        self._slots.append(slot)
        prepared = await self._pipeline.prepare(exec)
        if isinstance(prepared, ToolOutcome):
            slot.outcome = prepared
            if prepared.fatal is not None and self.fatal is None:
                self.fatal = prepared.fatal
            return  # denied or failed: nothing to dispatch
        if inline:
            slot.outcome = await self._approve_then_dispatch(slot, prepared)
        else:
            slot.task = self._spawn(self._approve_then_dispatch(slot, prepared))
            self._in_flight.add(slot.task)

    async def _approve_then_dispatch(
        self, slot: _Slot, pending: PendingApproval | None
    ) -> ToolOutcome:
        if pending is not None:
            denied = await self._pipeline.approve(slot.exec, pending)
            if denied is not None:
                return denied
        return await self._dispatch(slot)

    async def _dispatch(self, slot: _Slot) -> ToolOutcome:
        exec = slot.exec
        # Calls started in one tick wait for the same commit: one write for the pool.
        if self._before_dispatch is not None:
            try:
                await self._before_dispatch()
            except Exception as error:  # the call was never stored: it must not run
                return failure_outcome(error, final=True)
            if exec.signal.aborted:  # cancelled while the commit was written
                return failure_outcome(Aborted(exec.signal.reason), final=True)
        start_ns = time.time_ns()
        outcome = await self._pipeline.dispatch(exec)
        slot.ran = Ran(start_ns, time.time_ns())
        return outcome

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
            self._log.result(slot.exec, outcome, slot.seq, slot.ran)
            for context in outcome.contexts:
                self._log.context(context)

    async def _drain(self) -> None:
        await self._commit_ready()
        while self._cursor < len(self._slots):
            await self._settle_one()
            await self._commit_ready()
