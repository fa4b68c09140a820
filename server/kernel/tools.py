"""Tools: their definitions, the registry that scopes and orders them, and their calls."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentloop.v1 import content_pb2, decision_pb2, session_event_pb2
from server.kernel.abort import AbortSignal
from server.kernel.errors import CodedError
from server.kernel.jsonvalue import check_lossless, to_struct

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


@dataclass(frozen=True)
class ToolProgress:
    """How far a running call has got, as its tool says (MCP `notifications/progress`)."""

    progress: float
    total: float | None = None
    """The progress at which the call is done, when known."""
    message: str = ""


def no_progress(_: ToolProgress) -> None:
    """A call nobody watches the progress of."""


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
    report_progress: Callable[[ToolProgress], None] = no_progress
    """Shows the call's progress to the agent's live observers (rate-bounded there)."""

    @classmethod
    def of(
        cls,
        call: content_pb2.ToolCallBlock,
        *,
        agent_id: str,
        turn: int,
        step: int,
        signal: AbortSignal,
        report_progress: Callable[[ToolProgress], None] = no_progress,
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
            report_progress=report_progress,
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
    fatal: CodedError | None = None
    """Set when the call's failure must end the turn (a FAIL_CLOSED plugin failed)."""


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
    agents: frozenset[str] = frozenset()
    """When set, only these agents may see it (a plugin tool's agent filter)."""
    agent_id: str | None = None
    """Set for a tool scoped to one agent; it shadows a global tool of the same name.

    The opt-in rule applies to a scoped tool too.
    """
    enabled_by: Callable[[Collection[str]], bool] | None = None
    """For an opt-in tool: whether an agent's enabled names turn it on besides its own
    name (an MCP tool answers to `mcp:<server>/<tool>` and patterns of it)."""


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
        self._name_rules: list[Callable[[str], bool]] = []
        self.version = 0
        """Counts the changes of the registered tools: the same version, the same schemas."""

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
        self.version += 1

        def dispose() -> None:
            if table.get(tool.name) is tool:
                del table[tool.name]
                del self._schemas[tool]
                self.version += 1

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
        if table:
            self.version += 1
        table.clear()  # so that the tools' own disposers find nothing left to do
        self._guards = [entry for entry in self._guards if entry[0] != agent_id]

    def names(self) -> set[str]:
        """The names of the global tools, the ones an agent can enable."""
        return set(self._global)

    def name_rule(self, accepts: Callable[[str], bool]) -> Callable[[], None]:
        """Let agents enable names no tool has (yet): a tool source's opt-ins and patterns.

        Returns a disposer that removes the rule.
        """
        self._name_rules.append(accepts)
        return lambda: self._name_rules.remove(accepts) if accepts in self._name_rules else None

    def enableable(self) -> Collection[str]:
        """What an agent may name in its tools: the global tools and what a rule accepts."""
        return EnableableNames(self.names(), tuple(self._name_rules))

    def lookup(self, name: str, agent_id: str, enabled: Collection[str]) -> Tool | None:
        """The tool `name` as `agent_id` sees it, or None when it is unknown or hidden."""
        tool = self._scoped.get(agent_id, {}).get(name) or self._global.get(name)
        return tool if tool is not None and _usable(tool, agent_id, enabled) else None

    def visible(self, agent_id: str, enabled: Collection[str]) -> dict[str, Tool]:
        """The tools `agent_id` sees by name: its scoped tools shadow global ones."""
        merged = {**self._global, **self._scoped.get(agent_id, {})}
        return {name: tool for name, tool in merged.items() if _usable(tool, agent_id, enabled)}

    def schemas(
        self, agent_id: str, enabled: Collection[str], tool_order: Sequence[str] | None = None
    ) -> list[content_pb2.ToolSchema]:
        """The schemas of the visible tools, in canonical order (see `canonical_order`)."""
        visible = self.visible(agent_id, enabled)
        known = {*self._global, *self._scoped.get(agent_id, {})}
        schemas = []
        for name in canonical_order(visible, tool_order, known):
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


@dataclass(frozen=True)
class EnableableNames(Collection[str]):
    """Tool names, and the names the registry's rules accept (iterated: the names only)."""

    names: set[str]
    rules: tuple[Callable[[str], bool], ...]

    def __contains__(self, name: object) -> bool:
        if name in self.names:
            return True
        return isinstance(name, str) and any(accepts(name) for accepts in self.rules)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _usable(tool: Tool, agent_id: str, enabled: Collection[str]) -> bool:
    if tool.agents and agent_id not in tool.agents:
        return False
    if not tool.opt_in or tool.name in enabled:
        return True
    return tool.enabled_by is not None and tool.enabled_by(enabled)


def canonical_order(
    names: Collection[str], tool_order: Sequence[str] | None, known: Collection[str] = ()
) -> list[str]:
    """`names` sorted, or arranged by `tool_order`.

    `tool_order` lists names plus exactly one `UNLISTED_TOOLS` marker, where the
    names it does not list go, sorted. A listed name that is `known` (registered) but
    not among `names` (this agent does not see it) is skipped, so that one server-wide
    order serves agents with different tools.

    Raises:
        CodedError: (code INVALID_TOOL_ORDER) `tool_order` names a tool that is
            neither in `names` nor `known`, or names one twice, or the marker is
            missing or repeated.
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
        if name not in names and name not in known:
            raise CodedError(f'toolOrder names unknown tool "{name}"', "INVALID_TOOL_ORDER")
    listed_set = set(listed)
    if len(listed_set) != len(listed):
        raise CodedError("toolOrder names a tool twice", "INVALID_TOOL_ORDER")
    unlisted = [name for name in ordered if name not in listed_set]
    result: list[str] = []
    for name in tool_order:
        if name == UNLISTED_TOOLS:
            result.extend(unlisted)
        elif name in names:
            result.append(name)
    return result
