"""The per-call tool pipeline: pre-execute, guards, execute, post-execute, result.

A started call goes through three stages, split the way the scheduler runs them:

- `prepare` (ordered): the `tools/pre-execute` waterfall, then the guards; an ask
  (or a tool the agent's `approval_required_tools` names) instead records an
  approval request and returns it (`server.loop.approvals`).
- `approve` (may overlap other calls): wait for the answer, then the guards.
- `dispatch` (may overlap other calls): the `tools/execute` waterfall around the
  tool body. Every tool failure is normalised into an error result.
- `finalize` (ordered, in model order): the `tools/post-execute` waterfall, the
  lossless-JSON check of `meta`, then the contained `tools/result` emit.

A throwing pre-execute or execute listener gives a *final* error result, which
skips post-execute. A `TurnFatal` failure (a FAIL_CLOSED plugin) gives a final
result with neutral text and `fatal` set: the scheduler then ends the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Collection, Sequence

from agentloop.v1 import content_pb2, decision_pb2, session_event_pb2
from server.kernel.authored import authored_waterfall
from server.kernel.content import text_content
from server.kernel.errors import Aborted, CodedError, TurnFatal
from server.kernel.jsonvalue import check_lossless
from server.kernel.seams import (
    TOOLS_EXECUTE,
    TOOLS_POST_EXECUTE,
    TOOLS_PRE_EXECUTE,
    TOOLS_RESULT,
    Next,
    Registration,
    SeamRegistry,
    ToolCallResult,
    WaterfallListener,
)
from server.kernel.tools import (
    NOT_LOSSLESS,
    ExecutionMode,
    ToolExecution,
    ToolOutcome,
    ToolRegistry,
    ToolReturn,
    ToolValue,
)
from server.loop.approvals import (
    BY_LISTENER,
    BY_POLICY,
    Approvals,
    PendingApproval,
    unavailable_text,
)

FATAL_TEXT = "Error: the tool call was stopped; the turn ended with an error"
"""What the log (and a later model request) shows for a call whose failure ended the turn."""


def failure_outcome(exc: BaseException, *, final: bool = False) -> ToolOutcome:
    """The error result of a failure: `Error: <message>`, classified when it has a code."""
    if isinstance(exc, TurnFatal):
        fatal = session_event_pb2.ToolError(name="TurnFatal", code=exc.code)
        return ToolOutcome(text_content(FATAL_TEXT), is_error=True, error=fatal, final=True,
                           fatal=exc)  # fmt: skip
    if isinstance(exc, Aborted):
        return ToolOutcome(
            text_content(f"Error: aborted: {exc.reason}"), is_error=True, final=final
        )
    error = None
    if isinstance(exc, CodedError) and exc.code:
        error = session_event_pb2.ToolError(name=type(exc).__name__, code=exc.code)
    message = str(exc) or type(exc).__name__
    return ToolOutcome(text_content(f"Error: {message}"), is_error=True, error=error, final=final)


class ToolPipeline:
    """The stages of one agent's tool calls, bound to its registry, seams and enabled tools."""

    def __init__(
        self,
        registry: ToolRegistry,
        seams: SeamRegistry,
        agent_id: str,
        enabled: Collection[str],
        approvals: Approvals | None = None,
        approval_required: Collection[str] = (),
    ) -> None:
        self._registry = registry
        self._seams = seams
        self._agent_id = agent_id
        self._enabled = enabled
        self._approvals = approvals
        self._approval_required = frozenset(approval_required)

    def execution_mode(self, exec: ToolExecution) -> ExecutionMode:
        """The call's mode, read afresh from the registry."""
        return self._registry.execution_mode(
            exec, self._registry.visible(self._agent_id, self._enabled)
        )

    async def run(self, exec: ToolExecution) -> ToolOutcome:
        """All the stages, one after the other."""
        prepared = await self.prepare(exec)
        if isinstance(prepared, PendingApproval):
            outcome = await self.approve(exec, prepared)
        else:
            outcome = prepared
        if outcome is None:
            outcome = await self.dispatch(exec)
        return await self.finalize(exec, outcome)

    async def prepare(self, exec: ToolExecution) -> ToolOutcome | PendingApproval | None:
        """Pre-execute and guards, or the approval request of an ask.

        Returns:
            None when the call may be dispatched; a `PendingApproval` approval to `approve`
            first; otherwise its result without dispatch: a denial, or a final
            error when a listener or guard threw.
        """
        try:
            reason = await self._denial(exec)
        except Exception as exc:
            return failure_outcome(exc, final=True)
        if reason is None or isinstance(reason, PendingApproval):
            return reason
        return _denied(reason)

    async def approve(self, exec: ToolExecution, pending: PendingApproval) -> ToolOutcome | None:
        """Wait for the approval, then the guards: None to dispatch, else the result."""
        assert self._approvals is not None
        try:
            reason = await self._approvals.wait(pending, exec.signal)
            if reason is None:
                reason = self._guard_denial(exec)
        except Exception as exc:
            return failure_outcome(exc, final=True)
        return None if reason is None else _denied(reason)

    async def _denial(self, exec: ToolExecution) -> str | PendingApproval | None:
        decision, author = await authored_waterfall(
            self._seams, TOOLS_PRE_EXECUTE, self._agent_id, lambda: exec,
            decision_pb2.PreToolDecision(), exec.name,
        )  # fmt: skip
        if not isinstance(decision, decision_pb2.PreToolDecision):
            raise TypeError("a tools/pre-execute listener must return a PreToolDecision")
        kind = decision.WhichOneof("decision")
        if kind == "deny":
            return decision.deny.reason or f'tool "{exec.name}" was denied'
        if kind == "ask":
            asker = author.origin if author is not None else ""
            return self._ask(exec, decision.ask.reason, asker or BY_LISTENER)
        if exec.name in self._approval_required:
            return self._ask(exec, "", BY_POLICY)
        return self._guard_denial(exec)

    def _ask(self, exec: ToolExecution, reason: str, requested_by: str) -> str | PendingApproval:
        """Hold the call for approval, or deny it when no approval can be asked for."""
        if self._approvals is None or not self._approvals.available:
            return reason or unavailable_text(exec.name)
        return self._approvals.open(exec, reason, requested_by)

    def _guard_denial(self, exec: ToolExecution) -> str | None:
        for guard in self._registry.guards(self._agent_id):
            reason = guard(exec)
            if isinstance(reason, str):
                return reason or f'tool "{exec.name}" was denied'
        return None

    async def dispatch(self, exec: ToolExecution) -> ToolOutcome:
        """The `tools/execute` waterfall around the tool body; never raises for a failure.

        A wrapper is called as `fn(exec, next)`; `next()` runs the rest of the chain
        and, innermost, the tool body. `next(exec2)` passes on `exec2.signal`: the
        signal is the only thing a wrapper may change.
        """
        chain = self._seams.listeners(TOOLS_EXECUTE, self._agent_id)
        if not chain:  # the body alone: no chain to run
            try:
                return await self._run_body(exec)
            except Exception as exc:
                return failure_outcome(exc, final=True)

        try:
            return await _ExecChain(chain, self._run_body).run(0, exec)
        except Exception as exc:
            return failure_outcome(exc, final=True)

    async def _run_body(self, exec: ToolExecution) -> ToolOutcome:
        tool = self._registry.lookup(exec.name, self._agent_id, self._enabled)
        if tool is None:
            return ToolOutcome(
                text_content(f'Error: unknown tool "{exec.name}"'),
                is_error=True,
                error=session_event_pb2.ToolError(name="ToolNotFoundError", code="UNKNOWN_TOOL"),
            )
        try:
            return _outcome_of(await tool.execute(exec))
        except asyncio.CancelledError:
            # A cancellation that did not target our own task (the signal fired, or the
            # tool cancelled something of its own) is the tool's failure, not the loop's.
            task = asyncio.current_task()
            if task is None or task.cancelling() == 0:
                if exec.signal.aborted:
                    return failure_outcome(Aborted(exec.signal.reason))
                return failure_outcome(CodedError("the tool was cancelled", "CANCELLED"))
            raise
        except Exception as exc:
            return failure_outcome(exc)

    async def finalize(self, exec: ToolExecution, outcome: ToolOutcome) -> ToolOutcome:
        """Post-execute (unless `outcome` is final), the meta check, the `tools/result` emit."""
        if not outcome.final:
            outcome = await self._post_execute(exec, outcome)
        outcome = _checked_meta(outcome)
        if self._seams.has(TOOLS_RESULT, self._agent_id):
            self._seams.emit(TOOLS_RESULT, self._agent_id, ToolCallResult(exec, _snapshot(outcome)))
        return outcome

    async def _post_execute(self, exec: ToolExecution, outcome: ToolOutcome) -> ToolOutcome:
        if not self._seams.has(TOOLS_POST_EXECUTE, self._agent_id, exec.name):
            return outcome
        try:
            decision = await self._seams.waterfall(
                TOOLS_POST_EXECUTE,
                self._agent_id,
                lambda: ToolCallResult(exec, _snapshot(outcome)),
                decision_pb2.PostToolDecision(),
                exec.name,
            )
            if not isinstance(decision, decision_pb2.PostToolDecision):
                raise TypeError("a tools/post-execute listener must return a PostToolDecision")
        except Exception as exc:
            return failure_outcome(exc, final=True)
        return _apply_post_decision(outcome, decision)


class _ExecChain:
    """One `tools/execute` dispatch: its wrappers, then the tool body.

    An object, not a closure that calls itself (a reference cycle per tool call, freed
    only by the cycle collector); `server.kernel.seams` runs its waterfalls the same way.
    """

    __slots__ = ("_listeners", "_body")

    def __init__(
        self,
        listeners: Sequence[Registration[WaterfallListener[ToolExecution, ToolOutcome]]],
        body: Callable[[ToolExecution], Awaitable[ToolOutcome]],
    ) -> None:
        self._listeners = listeners
        self._body = body

    async def run(self, index: int, current: ToolExecution) -> ToolOutcome:
        """Run the chain from wrapper `index` on `current`."""
        listeners = self._listeners
        if index == len(listeners):
            return await self._body(current)
        result: object = listeners[index].fn(current, _ExecNext(self.run, index + 1, current))
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, ToolOutcome):
            raise TypeError("a tools/execute listener must return a ToolOutcome")
        return result


class _ExecNext(Next[ToolExecution, ToolOutcome]):
    """`next(exec2)` of `tools/execute` passes on `exec2.signal`, and nothing else."""

    __slots__ = ()

    def __call__(self, replacement: ToolExecution | None = None) -> Awaitable[ToolOutcome]:
        if replacement is None:
            return self._run(self._index, self._current)
        return self._run(self._index, dataclasses.replace(self._current, signal=replacement.signal))


def _denied(reason: str) -> ToolOutcome:
    return ToolOutcome(text_content(f"Error: {reason}"), is_error=True)


def _outcome_of(value: ToolValue) -> ToolOutcome:
    if isinstance(value, ToolReturn):
        return ToolOutcome(
            _content_of(value.content),
            is_error=value.is_error,
            meta=value.meta,
            contexts=list(value.contexts),
        )
    return ToolOutcome(_content_of(value))


def _content_of(value: object) -> list[content_pb2.ContentBlock]:
    if isinstance(value, str):
        return text_content(value)
    if isinstance(value, list) and all(isinstance(b, content_pb2.ContentBlock) for b in value):
        return list(value)
    raise TypeError(
        f"a tool must return text, content blocks or a ToolReturn, not {type(value).__name__}"
    )


def _snapshot(outcome: ToolOutcome) -> ToolOutcome:
    """A deep copy for listeners and observers, so that they cannot change the result."""
    meta = outcome.meta
    # Meta that cannot be copied is not JSON anyway: the meta check refuses it later.
    with contextlib.suppress(Exception):
        meta = copy.deepcopy(meta)
    return ToolOutcome(
        content=copy.deepcopy(outcome.content),
        is_error=outcome.is_error,
        error=copy.deepcopy(outcome.error),
        meta=meta,
        contexts=copy.deepcopy(outcome.contexts),
        final=outcome.final,
    )


def _apply_post_decision(
    outcome: ToolOutcome, decision: decision_pb2.PostToolDecision
) -> ToolOutcome:
    kind = decision.WhichOneof("decision")
    if kind == "block":
        # Only the decision's contexts survive a block.
        return dataclasses.replace(
            outcome,
            content=text_content(decision.block.feedback),
            is_error=True,
            contexts=list(decision.block.additional_contexts),
        )
    if kind == "accept":
        accept = decision.accept
        return dataclasses.replace(
            outcome,
            content=list(accept.content) or outcome.content,
            contexts=[*outcome.contexts, *accept.additional_contexts],
        )
    return outcome


def _checked_meta(outcome: ToolOutcome) -> ToolOutcome:
    meta: object = outcome.meta
    if meta is None:
        return outcome
    try:
        if not isinstance(meta, dict):
            raise TypeError("meta must be a JSON object")
        check_lossless(meta, "tool result meta")
    except TypeError:
        return ToolOutcome(
            text_content(NOT_LOSSLESS),
            is_error=True,
            contexts=outcome.contexts,
            final=outcome.final,
        )
    return outcome
