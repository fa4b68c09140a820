"""The seam registry: one ordered list of listeners per seam, typed dispatch per kind.

Every extension point of the loop is a named seam, declared here once as a typed key:
`Waterfall[In, Out]`, `Serial[In, Out]`, `Emit[In]` or `Gather[In, Out]`, where `In` is the one
frozen input object a listener receives and `Out` what it answers. Each kind is a
`Seam[L]` whose `L` is its listener type, so `SeamRegistry.on(key, fn)` (one signature)
takes only a listener of the type its key says. Listeners are kept in
one order, by order number and then by name (registration order breaks the remaining
ties), so that in-process and remote listeners interleave predictably. A listener is
global or scoped to one agent; a scoped listener only sees dispatches for its agent.

- `waterfall`: around-middleware. Each listener is called as `fn(input, next)` and may
  await `next()` (the rest of the chain, ending in the loop's default), transform the
  result, call `next(new_input)` so the rest of the chain sees a transformed input, or
  return its own value without calling `next()`. A throw propagates. When the seam
  carries its value in the input (`Waterfall.carried`), the innermost `next()`
  returns the value as it arrived; otherwise it returns the default.
- `serial`: listeners are awaited one at a time; the first "bail" value (anything but
  None or False) stops the chain and is returned. A throw propagates.
- `emit`: notifications. Every listener runs; a throw (or a failed coroutine) is
  logged, counted and contained.
- `Gather` seams are called by their owner (approvals, the flush), concurrently.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, NamedTuple, Protocol, TypeVar, cast

from agentloop.v1 import approval_pb2 as ap
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.abort import AbortSignal
from server.kernel.prompt import Assembly
from server.kernel.tasks import cancel_and_wait
from server.kernel.tools import ToolExecution, ToolOutcome

if TYPE_CHECKING:
    from agentloop.v1 import agent_event_pb2 as ae

log = logging.getLogger(__name__)


class SeamAgent(Protocol):
    """The agent a seam input names, as its listeners see it (the loop's `Agent` is one).

    Declared here, with the seams, so that the kernel names no type of the loop above it.
    """

    @property
    def agent_id(self) -> str:
        """The agent's id."""
        ...

    def inject(self, context: d.HookContext, request_id: str = "") -> None:
        """Queue context for the agent's next model request."""
        ...


In = TypeVar("In")
Out = TypeVar("Out")
T = TypeVar("T")
L = TypeVar("L", contravariant=True)
"""A seam's listener type: a key takes a listener of that type (or of a subtype)."""
Fn = TypeVar("Fn")


# -- listeners -------------------------------------------------------------------------


class Next(Generic[In, Out]):
    """The rest of a waterfall chain: `next()` passes the input on, `next(new)` a new one."""

    __slots__ = ("_run", "_index", "_current")

    def __init__(self, run: Callable[[int, In], Awaitable[Out]], index: int, current: In) -> None:
        self._run = run
        self._index = index
        self._current = current

    def __call__(self, replacement: In | None = None) -> Awaitable[Out]:
        """Run the rest of the chain with `replacement`, or with the input unchanged."""
        return self._run(self._index, self._current if replacement is None else replacement)


WaterfallListener = Callable[[In, Next[In, Out]], Awaitable[Out] | Out]


class _Chain(Generic[In, Out]):
    """One waterfall dispatch: its listeners, and what the innermost `next()` returns.

    An object, not a closure that calls itself: such a closure holds itself in a cell,
    a reference cycle per dispatch that only the cycle collector frees, together with
    every input and decision it holds (a plugin on every seam made about 90 cyclic
    objects per turn, and with them more full collections).
    """

    __slots__ = ("_listeners", "_default", "_carried")

    def __init__(
        self,
        listeners: Sequence[Registration[WaterfallListener[In, Out]]],
        default: Out,
        carried: Callable[[In], Out] | None,
    ) -> None:
        self._listeners = listeners
        self._default = default
        self._carried = carried

    async def run(self, index: int, current: In) -> Out:
        """Run the chain from listener `index` on `current`."""
        listeners = self._listeners
        if index == len(listeners):
            carried = self._carried
            return self._default if carried is None else carried(current)
        result = listeners[index].fn(current, Next(self.run, index + 1, current))
        if inspect.isawaitable(result):
            return cast(Out, await result)
        return result


SerialListener = Callable[[In], Awaitable[Out | None] | Out | None]
EmitListener = Callable[[In], object]
GatherListener = Callable[[In], Awaitable[Out] | Out]


# -- seam keys -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SeamKey:
    """A seam's identity: its path name (`agent/request`, ...)."""

    path: str

    def __str__(self) -> str:
        return self.path


@dataclass(frozen=True, eq=False)
class Seam(SeamKey, Generic[L]):
    """A seam whose listeners have the type `L` (its kind's listener over its types)."""


@dataclass(frozen=True, eq=False)
class Waterfall(Seam[WaterfallListener[In, Out]], Generic[In, Out]):
    """An around-middleware seam: input `In`, result `Out`."""

    carried: Callable[[In], Out] | None = None
    """The value under transformation, read from the input: what the innermost `next()`
    returns. None: the innermost `next()` returns the dispatch's default."""


@dataclass(frozen=True, eq=False)
class Serial(Seam[SerialListener[In, Out]], Generic[In, Out]):
    """A checkpoint: input `In`; the first listener answering an `Out` stops the chain."""


@dataclass(frozen=True, eq=False)
class Emit(Seam[EmitListener[In]], Generic[In]):
    """A notification of an `In`; failures are contained."""


@dataclass(frozen=True, eq=False)
class Gather(Seam[GatherListener[In, Out]], Generic[In, Out]):
    """Listeners called concurrently by the seam's owner, each with an `In`, answering `Out`."""


# -- seam inputs -----------------------------------------------------------------------


@dataclass(frozen=True)
class AgentCall:
    """What every agent seam's input carries: the agent, where the loop is, the signal."""

    agent: SeamAgent
    turn: int
    step: int
    signal: AbortSignal
    """Fires when the call's work is cancelled. One rule per seam kind: a seam called
    while a step is open (session-prefix, pre-step, request, step-result, and the tool
    seams through their execution) gets the step's signal; a seam called between steps
    (prompt-submit, turn-continuation, turn-stop) gets the turn's. The two fire together
    on a cancel during a step; a step's signal is new each step."""

    @property
    def agent_id(self) -> str:
        """The agent's id."""
        return self.agent.agent_id


@dataclass(frozen=True)
class PromptSubmit(AgentCall):
    """`agent/prompt-submit`: a queued prompt about to open the turn."""

    content: list[c.ContentBlock]
    source: c.Source


@dataclass(frozen=True)
class SessionPrefix(AgentCall):
    """`agent/session-prefix`: compose the prefix (outward: listeners wrap `next()`)."""


@dataclass(frozen=True)
class PreStep(AgentCall):
    """`agent/pre-step`: the step about to run."""

    system: str
    prefix: Sequence[c.Message]


@dataclass(frozen=True)
class Request(AgentCall):
    """`agent/request`: the model configuration of the step's request."""

    config: c.ModelConfig


@dataclass(frozen=True)
class StepResult(AgentCall):
    """`agent/step-result`: the step's assistant message."""

    message: c.Message


@dataclass(frozen=True)
class Compact(AgentCall):
    """`agent/compact`: the summary of a compaction (empty: the agent's model writes it)."""

    messages: list[c.Message]
    instructions: str
    trigger: int
    tokens_before: int
    summary: str = ""


@dataclass(frozen=True)
class TurnContinuation(AgentCall):
    """`agent/turn-continuation`: the loop's decision so far."""

    decision: d.ContinuationDecision


@dataclass(frozen=True)
class TurnStop(AgentCall):
    """`agent/turn-stop`: whether the turn's stop is terminal."""


@dataclass(frozen=True)
class ToolCallResult:
    """A tool call's result: `tools/post-execute`, `tools/result`, `tools/result-committed`."""

    exec: ToolExecution
    outcome: ToolOutcome

    @property
    def agent_id(self) -> str:
        """The calling agent."""
        return self.exec.agent_id

    @property
    def turn(self) -> int:
        """The turn of the call."""
        return self.exec.turn

    @property
    def step(self) -> int:
        """The step of the call."""
        return self.exec.step

    @property
    def signal(self) -> AbortSignal:
        """The step's signal."""
        return self.exec.signal


@dataclass(frozen=True)
class ApprovalAsk:
    """`tools/approval`: a stored pending approval, and the signal withdrawing it."""

    agent_id: str
    request: ap.ApprovalRequested
    signal: AbortSignal

    @property
    def turn(self) -> int:
        """The turn of the held call."""
        return self.request.turn

    @property
    def step(self) -> int:
        """The step of the held call."""
        return self.request.step


ApprovalAnswer = tuple[ap.ApprovalDecision.ValueType, str] | None
"""An approver's decision and reason; None abstains."""


@dataclass(frozen=True)
class AgentNotice:
    """An agent, for the emits that say something about it."""

    agent: SeamAgent

    @property
    def agent_id(self) -> str:
        """The agent's id."""
        return self.agent.agent_id


@dataclass(frozen=True)
class SessionStarted(AgentNotice):
    """`agent/session-start`: the agent was published; the source of its creation."""

    source: ae.SessionStartSource.ValueType


@dataclass(frozen=True)
class StatusChanged(AgentNotice):
    """`agent/status`: the status's name (`idle`, `running`, `disposed`)."""

    status: str


@dataclass(frozen=True)
class Queued(AgentNotice):
    """`agent/queued`: a message was queued (or steered)."""

    content: list[c.ContentBlock]
    source: c.Source
    steering: bool


@dataclass(frozen=True)
class AgentFailed(AgentNotice):
    """`agent/error`: turn `turn` failed at step `step`."""

    turn: int
    step: int
    error: BaseException


# The two notices below are sent for every event (chunks included): named tuples,
# immutable like the dataclasses above and a third of their construction cost.


class SessionEventSeen(NamedTuple):
    """A session event of the agent (`session/event`, `session/committed`)."""

    agent: SeamAgent
    event: ev.SessionEvent

    @property
    def agent_id(self) -> str:
        """The agent's id."""
        return self.agent.agent_id


class AgentEventSeen(NamedTuple):
    """`agent/event`: a live agent event."""

    agent: SeamAgent
    event: ae.AgentEvent

    @property
    def agent_id(self) -> str:
        """The agent's id."""
        return self.agent.agent_id


def _config(i: Request) -> c.ModelConfig:
    return i.config


def _message(i: StepResult) -> c.Message:
    return i.message


def _decision(i: TurnContinuation) -> d.ContinuationDecision:
    return i.decision


def _summary(i: Compact) -> str:
    return i.summary


# -- the seams -------------------------------------------------------------------------

# Waterfalls.
PROMPT_SUBMIT: Waterfall[PromptSubmit, d.PromptDecision] = Waterfall("agent/prompt-submit")
SESSION_PREFIX: Waterfall[SessionPrefix, list[c.Message]] = Waterfall("agent/session-prefix")
REQUEST: Waterfall[Request, c.ModelConfig] = Waterfall("agent/request", _config)
STEP_RESULT: Waterfall[StepResult, c.Message] = Waterfall("agent/step-result", _message)
TURN_CONTINUATION: Waterfall[TurnContinuation, d.ContinuationDecision] = Waterfall(
    "agent/turn-continuation", _decision
)
COMPACT: Waterfall[Compact, str] = Waterfall("agent/compact", _summary)
SYSTEM_PROMPT_ASSEMBLE: Waterfall[Assembly, Assembly] = Waterfall("system-prompt/assemble")
TOOLS_PRE_EXECUTE: Waterfall[ToolExecution, d.PreToolDecision] = Waterfall("tools/pre-execute")
TOOLS_EXECUTE: Waterfall[ToolExecution, ToolOutcome] = Waterfall("tools/execute")
"""Dispatched by the tool pipeline: `next(exec2)` passes on `exec2.signal` only."""
TOOLS_POST_EXECUTE: Waterfall[ToolCallResult, d.PostToolDecision] = Waterfall("tools/post-execute")
# Serial checkpoints.
PRE_STEP: Serial[PreStep, object] = Serial("agent/pre-step")
TURN_STOP: Serial[TurnStop, d.ContinuationStop] = Serial("agent/turn-stop")
# Emits.
SESSION_START: Emit[SessionStarted] = Emit("agent/session-start")
STATUS: Emit[StatusChanged] = Emit("agent/status")
QUEUED: Emit[Queued] = Emit("agent/queued")
ERROR: Emit[AgentFailed] = Emit("agent/error")
CREATED: Emit[SeamAgent] = Emit("agent/created")
"""Called (not emitted) at creation: a throw vetoes publication."""
DISPOSED: Emit[SeamAgent] = Emit("agent/disposed")
TOOLS_RESULT: Emit[ToolCallResult] = Emit("tools/result")
TOOLS_RESULT_COMMITTED: Emit[ToolCallResult] = Emit("tools/result-committed")
"""Each final tool result once its `tool/result` event is stored: what plugins observe."""
SESSION_EVENT: Emit[SessionEventSeen] = Emit("session/event")
"""Every appended session event, in-process, at the append."""
SESSION_COMMITTED: Emit[SessionEventSeen] = Emit("session/committed")
"""Every session event once it is stored: what plugins observe."""
AGENT_EVENT: Emit[AgentEventSeen] = Emit("agent/event")
"""Every live agent event."""
# Approvers (called concurrently by `server.loop.approvals`, not dispatched as a chain).
TOOLS_APPROVAL: Gather[ApprovalAsk, ApprovalAnswer] = Gather("tools/approval")
"""Approvers of pending approvals; each answers or abstains (None)."""

KEYS: dict[str, SeamKey] = {
    key.path: key for key in list(globals().values()) if isinstance(key, SeamKey)
}
"""Every seam above, by path."""


# -- the registry ----------------------------------------------------------------------

F = TypeVar("F", covariant=True)


@dataclass(frozen=True, eq=False)
class Registration(Generic[F]):
    """One listener on one seam."""

    seam: SeamKey
    fn: F
    order: int
    name: str
    agent_id: str | None
    serial: int = field(default=0)
    origin: str = ""
    """Who the listener speaks for in the records its decisions cause (a plugin's
    listener: `plugin:NAME`); empty for an in-process listener."""

    def sort_key(self) -> tuple[int, str, int]:
        """Order number, then name, then registration order."""
        return (self.order, self.name, self.serial)


class SeamRegistry:
    """Listeners of every seam, in dispatch order."""

    def __init__(self) -> None:
        self._by_seam: dict[SeamKey, list[Registration[object]]] = {}
        self._scoped: set[SeamKey] = set()
        self.heard: set[SeamKey] = set()
        """The seams with at least one listener (any agent's): a set lookup, not a call,
        lets a hot path skip a seam nobody listens to before asking `has`."""
        """Seams with an agent-scoped listener; the others need no filtering per dispatch."""
        self._counter = 0
        self.contained_failures = 0
        """How many emit listeners failed (each is logged too)."""
        self._tasks: set[asyncio.Future[object]] = set()

    def on(
        self, seam: Seam[Fn], fn: Fn, *, order: int = 0,
        name: str = "", agent_id: str | None = None, prepend: bool = False, origin: str = "",
    ) -> Callable[[], None]:  # fmt: skip
        """Register `fn` on `seam`; returns a disposer that removes it.

        `prepend` places the listener ahead of every ordinary one (order -10**9);
        `origin` is who it speaks for (`Registration.origin`).
        """
        self._counter += 1
        reg = Registration(
            seam, fn, -(10**9) if prepend else order, name, agent_id, self._counter, origin
        )
        listeners = [*self._by_seam.get(seam, []), reg]
        listeners.sort(key=Registration.sort_key)
        self._set(seam, listeners)

        def dispose() -> None:
            current = self._by_seam.get(seam, [])
            if reg in current:
                self._set(seam, [r for r in current if r is not reg])

        return dispose

    def remove_agent(self, agent_id: str) -> None:
        """Remove every listener scoped to `agent_id`."""
        for seam, listeners in list(self._by_seam.items()):
            self._set(seam, [r for r in listeners if r.agent_id != agent_id])

    def _set(self, seam: SeamKey, listeners: list[Registration[object]]) -> None:
        # Lists are replaced, never changed in place: a dispatch may hold the old one.
        self._by_seam[seam] = listeners
        if listeners:
            self.heard.add(seam)
        else:
            self.heard.discard(seam)
        if any(r.agent_id is not None for r in listeners):
            self._scoped.add(seam)
        else:
            self._scoped.discard(seam)

    def listeners(self, seam: Seam[Fn], agent_id: str | None) -> Sequence[Registration[Fn]]:
        """The listeners that see a dispatch of `seam` for `agent_id`, in order (read-only).

        Each was registered by `on`, which takes only a listener of the type the seam's
        key says: the cast restores what the shared table forgot.
        """
        regs = self._by_seam.get(seam)
        if not regs:
            return []
        if seam in self._scoped:
            regs = [r for r in regs if r.agent_id is None or r.agent_id == agent_id]
        # Unscoped: the list itself, which is never changed in place.
        return cast("Sequence[Registration[Fn]]", regs)  # a string: no subscript per call

    def has(self, seam: SeamKey, agent_id: str | None) -> bool:
        """Whether any listener would see a dispatch of `seam` for `agent_id`."""
        regs = self._by_seam.get(seam)
        if not regs:
            return False
        if seam not in self._scoped:
            return True
        return any(r.agent_id is None or r.agent_id == agent_id for r in regs)

    async def waterfall(
        self, seam: Waterfall[In, Out], agent_id: str | None, build: Callable[[], In], default: Out
    ) -> Out:
        """Run the around-middleware chain over the input `build()` makes.

        The input is built only when a listener sees the dispatch: a seam without one
        costs a lookup, not an input object. The innermost `next()` returns the value
        the (possibly replaced) input carries when the seam says so
        (`Waterfall.carried`), else `default`.
        """
        chain = self.listeners(seam, agent_id)
        if not chain:
            return default
        return await _Chain(chain, default, seam.carried).run(0, build())

    async def serial(
        self, seam: Serial[In, Out], agent_id: str | None, build: Callable[[], In]
    ) -> Out | None:
        """Await each listener in order; return the first bail value, else None.

        The input is built by `build()`, only when a listener sees the dispatch.
        """
        chain = self.listeners(seam, agent_id)
        if not chain:
            return None
        input = build()
        for reg in chain:
            result = reg.fn(input)
            if inspect.isawaitable(result):
                result = await result
            if result is not None and result is not False:
                return cast(Out, result)
        return None

    def emit(self, seam: Emit[In], agent_id: str | None, input: In) -> None:
        """Notify every listener; failures are logged and contained."""
        for reg in self.listeners(seam, agent_id):
            try:
                result = reg.fn(input)
            except Exception:
                self._contain(seam, reg)
                continue
            if result is not None and inspect.iscoroutine(result):
                task: asyncio.Future[object] = asyncio.ensure_future(result)
                self._tasks.add(task)
                task.add_done_callback(functools.partial(self._settled, seam, reg))

    async def close(self) -> None:
        """Cancel the emit listeners still running and wait for them (server shutdown)."""
        while self._tasks:
            await cancel_and_wait(list(self._tasks))

    def _settled(self, seam: SeamKey, reg: Registration[F], task: asyncio.Future[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.contained_failures += 1
            log.warning(
                "listener %r on %s failed", reg.name or reg.fn, seam, exc_info=task.exception()
            )

    def _contain(self, seam: SeamKey, reg: Registration[F]) -> None:
        self.contained_failures += 1
        log.warning("listener %r on %s failed", reg.name or reg.fn, seam, exc_info=True)
