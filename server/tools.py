"""The tool registry and the per-call pipeline: pre-execute, guards, execute, post-execute, result.

A started call goes through three stages, split the way the scheduler runs them:

- `prepare` (ordered): the `tools/pre-execute` waterfall, approval on ask (there is
  no approval channel, so ask is a denial), then the guards.
- `dispatch` (may overlap other calls): the `tools/execute` waterfall around the
  tool body. Every tool failure is normalised into an error result.
- `finalize` (ordered, in model order): the `tools/post-execute` waterfall, the
  lossless-JSON check of `meta`, then the contained `tools/result` emit.

A throwing pre-execute or execute listener gives a *final* error result, which
skips post-execute.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentloop.v1 import content_pb2, decision_pb2, session_event_pb2
from server.abort import AbortSignal
from server.content import text_content
from server.errors import Aborted, CodedError
from server.jsonvalue import check_lossless, to_struct
from server.seams import (
    TOOLS_EXECUTE,
    TOOLS_POST_EXECUTE,
    TOOLS_PRE_EXECUTE,
    TOOLS_RESULT,
    SeamRegistry,
)

UNLISTED_TOOLS = "<unlisted-tools>"
"""The `tool_order` marker where the tools it does not name go, sorted by name."""

NOT_LOSSLESS = "Error: tool result must be losslessly JSON-serializable"

ExecutionMode = Literal["parallel", "exclusive"]


def parse_arguments(raw: str) -> object:
    """The model's raw argument text as a value the tool can read.

    An empty string is `{}`; valid JSON is parsed; anything else (NaN and the
    infinities included) is passed through as the raw string, for the tool's own
    validation to report.
    """
    if raw == "":
        return {}
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        return raw


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True, eq=False)
class ToolExecution:
    """One started tool call, as every stage of the pipeline sees it."""

    call_id: str
    """The model's call id."""
    name: str
    """The tool name the model asked for."""
    arguments: object
    """The parsed arguments (see `parse_arguments`); treat them as read-only."""
    raw_arguments: str
    """The model's argument text, unparsed."""
    agent_id: str
    """The calling agent."""
    turn: int
    """The turn number."""
    step: int
    """The step number within the turn."""
    signal: AbortSignal
    """Fires when the step aborts; a `tools/execute` wrapper may replace it."""

    @classmethod
    def of(
        cls,
        call: content_pb2.ToolCallBlock,
        *,
        agent_id: str,
        turn: int,
        step: int,
        signal: AbortSignal,
    ) -> ToolExecution:
        """The execution of the model's `call`, with its arguments parsed."""
        return cls(
            call_id=call.id,
            name=call.name,
            arguments=parse_arguments(call.arguments),
            raw_arguments=call.arguments,
            agent_id=agent_id,
            turn=turn,
            step=step,
            signal=signal,
        )


@dataclass
class ToolReturn:
    """What a tool returns when it has more to say than its content."""

    content: str | list[content_pb2.ContentBlock]
    """Text, or content blocks, that the model sees."""
    is_error: bool = False
    """Whether the call failed."""
    meta: dict[str, object] | None = None
    """Free-form JSON kept on `tool/result`, never sent to the model."""
    contexts: list[decision_pb2.HookContext] = field(default_factory=list)
    """Contexts to add to the conversation after the batch's results."""


ToolValue = str | list[content_pb2.ContentBlock] | ToolReturn
ToolBody = Callable[[ToolExecution], Awaitable[ToolValue]]
ParallelSafe = bool | Callable[[object], object]
Guard = Callable[[ToolExecution], str | None]


@dataclass
class ToolOutcome:
    """The result of one call as it moves through the pipeline."""

    content: list[content_pb2.ContentBlock]
    """What the model sees."""
    is_error: bool = False
    """Whether the call failed."""
    error: session_event_pb2.ToolError | None = None
    """The failure's class and code, when the failure had a code."""
    meta: dict[str, object] | None = None
    """Free-form JSON from the tool, never sent to the model."""
    contexts: list[decision_pb2.HookContext] = field(default_factory=list)
    """The tool's contexts, then those post-execute added, in that order."""
    final: bool = False
    """A pipeline failure: `finalize` skips post-execute."""


@dataclass(frozen=True, eq=False)
class Tool:
    """A tool the model can call."""

    name: str
    """The name the model calls it by."""
    description: str
    """What the tool does, for the model."""
    input_schema: dict[str, object]
    """The JSON schema of the arguments."""
    execute: ToolBody
    """The tool body: `await execute(exec)` returns text, content blocks or a `ToolReturn`."""
    parallel_safe: ParallelSafe = False
    """True, or a classifier of the arguments; only an exact `True` runs in parallel."""
    opt_in: bool = True
    """Visible only to agents that enable it by name; False makes it visible to all."""
    agent_id: str | None = None
    """Set for a tool scoped to one agent; it shadows a global tool of the same name.

    The opt-in rule applies to a scoped tool too.
    """


class ToolArgumentsError(CodedError):
    """The arguments a tool received are invalid; the message says what is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "INVALID_ARGUMENTS")


class ToolRegistry:
    """Global and agent-scoped tools, and the guards that can deny a call."""

    def __init__(self) -> None:
        self._global: dict[str, Tool] = {}
        self._scoped: dict[str, dict[str, Tool]] = {}
        self._schemas: dict[Tool, content_pb2.ToolSchema] = {}
        self._guards: list[tuple[str | None, Guard]] = []

    def register(self, tool: Tool) -> Callable[[], None]:
        """Add `tool`; returns a disposer that removes it.

        Raises:
            ValueError: the name is empty or already taken in the tool's scope.
            TypeError: the input schema is not lossless JSON.
        """
        if not tool.name:
            raise ValueError("a tool needs a name")
        table = (
            self._global if tool.agent_id is None else self._scoped.setdefault(tool.agent_id, {})
        )
        if tool.name in table:
            raise ValueError(f'tool "{tool.name}" is already registered')
        check_lossless(tool.input_schema, f'the input schema of tool "{tool.name}"')
        # Built once: the schemas go into every request header.
        self._schemas[tool] = content_pb2.ToolSchema(
            name=tool.name, description=tool.description, input_schema=to_struct(tool.input_schema)
        )
        table[tool.name] = tool

        def dispose() -> None:
            if table.get(tool.name) is tool:
                del table[tool.name]
                del self._schemas[tool]

        return dispose

    def guard(self, fn: Guard, agent_id: str | None = None) -> Callable[[], None]:
        """Add a guard (global, or for one agent); returns a disposer that removes it."""
        entry = (agent_id, fn)
        self._guards.append(entry)

        def dispose() -> None:
            if entry in self._guards:
                self._guards.remove(entry)

        return dispose

    def guards(self, agent_id: str) -> list[Guard]:
        """The guards of a call by `agent_id`: global ones first, then the agent's."""
        return [fn for scope, fn in self._guards if scope is None] + [
            fn for scope, fn in self._guards if scope == agent_id
        ]

    def remove_agent(self, agent_id: str) -> None:
        """Remove every tool and guard scoped to `agent_id`."""
        table = self._scoped.pop(agent_id, {})
        for tool in table.values():
            del self._schemas[tool]
        table.clear()  # so that the tools' own disposers find nothing left to do
        self._guards = [entry for entry in self._guards if entry[0] != agent_id]

    def names(self) -> set[str]:
        """The names of the global tools, the ones an agent can enable."""
        return set(self._global)

    def lookup(self, name: str, agent_id: str, enabled: Collection[str]) -> Tool | None:
        """The tool `name` as `agent_id` sees it, or None when it is unknown or hidden."""
        tool = self._scoped.get(agent_id, {}).get(name) or self._global.get(name)
        return tool if tool is not None and _usable(tool, enabled) else None

    def visible(self, agent_id: str, enabled: Collection[str]) -> dict[str, Tool]:
        """The tools `agent_id` sees by name: its scoped tools shadow global ones."""
        merged = {**self._global, **self._scoped.get(agent_id, {})}
        return {name: tool for name, tool in merged.items() if _usable(tool, enabled)}

    def schemas(
        self, agent_id: str, enabled: Collection[str], tool_order: Sequence[str] | None = None
    ) -> list[content_pb2.ToolSchema]:
        """The schemas of the visible tools, in canonical order (see `canonical_order`)."""
        visible = self.visible(agent_id, enabled)
        schemas = []
        for name in canonical_order(visible, tool_order):
            schema = content_pb2.ToolSchema()
            schema.CopyFrom(self._schemas[visible[name]])
            schemas.append(schema)
        return schemas

    def execution_mode(self, exec: ToolExecution, visible: dict[str, Tool]) -> ExecutionMode:
        """Parallel only when the visible tool's classifier says exactly `True`."""
        tool = visible.get(exec.name)
        if tool is None:
            return "exclusive"
        safe: object = tool.parallel_safe
        if callable(safe):
            try:
                safe = safe(exec.arguments)
            except Exception:
                return "exclusive"
        return "parallel" if safe is True else "exclusive"


def _usable(tool: Tool, enabled: Collection[str]) -> bool:
    return not tool.opt_in or tool.name in enabled


def canonical_order(names: Collection[str], tool_order: Sequence[str] | None) -> list[str]:
    """`names` sorted, or arranged by `tool_order`.

    `tool_order` lists names plus exactly one `UNLISTED_TOOLS` marker, where the
    names it does not list go, sorted.

    Raises:
        CodedError: (code INVALID_TOOL_ORDER) `tool_order` names a tool not in
            `names` or names one twice, or the marker is missing or repeated.
    """
    ordered = sorted(names)
    if tool_order is None:
        return ordered
    if tool_order.count(UNLISTED_TOOLS) != 1:
        raise CodedError(
            f'toolOrder must contain "{UNLISTED_TOOLS}" exactly once', "INVALID_TOOL_ORDER"
        )
    listed = [name for name in tool_order if name != UNLISTED_TOOLS]
    for name in listed:
        if name not in names:
            raise CodedError(f'toolOrder names unknown tool "{name}"', "INVALID_TOOL_ORDER")
    if len(set(listed)) != len(listed):
        raise CodedError("toolOrder names a tool twice", "INVALID_TOOL_ORDER")
    unlisted = [name for name in ordered if name not in set(listed)]
    result: list[str] = []
    for name in tool_order:
        if name == UNLISTED_TOOLS:
            result.extend(unlisted)
        else:
            result.append(name)
    return result


def failure_outcome(exc: BaseException, *, final: bool = False) -> ToolOutcome:
    """The error result of a failure: `Error: <message>`, classified when it has a code."""
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
    ) -> None:
        self._registry = registry
        self._seams = seams
        self._agent_id = agent_id
        self._enabled = enabled

    def execution_mode(self, exec: ToolExecution) -> ExecutionMode:
        """The call's mode, read afresh from the registry."""
        return self._registry.execution_mode(
            exec, self._registry.visible(self._agent_id, self._enabled)
        )

    async def run(self, exec: ToolExecution) -> ToolOutcome:
        """All three stages, one after the other."""
        outcome = await self.prepare(exec)
        if outcome is None:
            outcome = await self.dispatch(exec)
        return await self.finalize(exec, outcome)

    async def prepare(self, exec: ToolExecution) -> ToolOutcome | None:
        """Pre-execute, approval and guards.

        Returns:
            None when the call may be dispatched; otherwise its result without
            dispatch: a denial, or a final error when a listener or guard threw.
        """
        try:
            reason = await self._denial(exec)
        except Exception as exc:
            return failure_outcome(exc, final=True)
        if reason is None:
            return None
        return ToolOutcome(text_content(f"Error: {reason}"), is_error=True)

    async def _denial(self, exec: ToolExecution) -> str | None:
        decision = await self._seams.waterfall(
            TOOLS_PRE_EXECUTE, self._agent_id, (exec,), decision_pb2.PreToolDecision()
        )
        if not isinstance(decision, decision_pb2.PreToolDecision):
            raise TypeError("a tools/pre-execute listener must return a PreToolDecision")
        kind = decision.WhichOneof("decision")
        if kind == "deny":
            return decision.deny.reason or f'tool "{exec.name}" was denied'
        if kind == "ask":
            # No approval channel exists yet: asking is denying.
            return (
                decision.ask.reason
                or f'tool "{exec.name}" requires approval (no approval channel is available)'
            )
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

        async def call(index: int, current: ToolExecution) -> ToolOutcome:
            if index == len(chain):
                return await self._run_body(current)

            def next_(replacement: ToolExecution | None = None) -> Awaitable[ToolOutcome]:
                if replacement is None:
                    return call(index + 1, current)
                return call(index + 1, dataclasses.replace(current, signal=replacement.signal))

            result = chain[index].fn(current, next_)
            if inspect.isawaitable(result):
                result = await result
            if not isinstance(result, ToolOutcome):
                raise TypeError("a tools/execute listener must return a ToolOutcome")
            return result

        try:
            return await call(0, exec)
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
            # Cancelled because the signal fired, not because our own task is cancelled.
            task = asyncio.current_task()
            if exec.signal.aborted and (task is None or task.cancelling() == 0):
                return failure_outcome(Aborted(exec.signal.reason))
            raise
        except Exception as exc:
            return failure_outcome(exc)

    async def finalize(self, exec: ToolExecution, outcome: ToolOutcome) -> ToolOutcome:
        """Post-execute (unless `outcome` is final), the meta check, the `tools/result` emit."""
        if not outcome.final:
            outcome = await self._post_execute(exec, outcome)
        outcome = _checked_meta(outcome)
        if self._seams.has(TOOLS_RESULT, self._agent_id):
            # Observers get a copy: they cannot change what is committed.
            self._seams.emit(TOOLS_RESULT, self._agent_id, (exec, copy.deepcopy(outcome)))
        return outcome

    async def _post_execute(self, exec: ToolExecution, outcome: ToolOutcome) -> ToolOutcome:
        if not self._seams.has(TOOLS_POST_EXECUTE, self._agent_id):
            return outcome
        try:
            decision = await self._seams.waterfall(
                TOOLS_POST_EXECUTE,
                self._agent_id,
                (exec, copy.deepcopy(outcome)),  # the result is read-only to listeners
                decision_pb2.PostToolDecision(),
            )
            if not isinstance(decision, decision_pb2.PostToolDecision):
                raise TypeError("a tools/post-execute listener must return a PostToolDecision")
        except Exception as exc:
            return failure_outcome(exc, final=True)
        return _apply_post_decision(outcome, decision)


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
