"""The seam registry: one ordered list of listeners per seam, typed dispatch per kind.

Every extension point of the loop is a named seam, declared here once as a typed key:
`Waterfall[In, Out]`, `Serial[In, Out]`, `Emit[In]` or `Gather[In, Out]`, where `In` is the one
frozen input object a listener receives and `Out` what it answers. Each kind is a
`Seam[L]` whose `L` is its listener type, so `SeamRegistry.on(key, fn)` (one signature)
takes only a listener of the type its key says. Listeners are kept in
one order, by order number and then by name (registration order breaks the remaining
ties), so that in-process and remote listeners interleave predictably. A listener is
global or scoped to one agent; a scoped listener only sees dispatches for its agent.
A listener may also concern only some agents (`applies`, a plugin's agent conditions):
each agent's dispatches follow its route, worked out once (`server.kernel.routes`),
past the listeners that do not concern it, each counted as skipping (`skip`).

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
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar, cast, overload

from agentloop.v1 import approval_pb2 as ap
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.abort import AbortSignal
from server.kernel.prompt import Assembly
from server.kernel.routes import AgentFilter, FacetFilter, Route, Skip, route, wanted
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

    __slots__ = ("_listeners", "_default", "_carried", "_skips")

    def __init__(
        self,
        listeners: Sequence[Registration[WaterfallListener[In, Out]]],
        default: Out,
        carried: Callable[[In], Out] | None,
        skips: tuple[tuple[Skip, ...], ...] | None = None,
    ) -> None:
        self._listeners = listeners
        self._default = default
        self._carried = carried
        self._skips = skips
        """`Route.skips`: the listeners sitting out, counted as the chain passes them."""

    async def run(self, index: int, current: In) -> Out:
        """Run the chain from listener `index` on `current`."""
        listeners = self._listeners
        if self._skips is not None:
            for counts, key in self._skips[index]:
                counts[key] += 1
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


class SessionEventRun(Sequence[SessionEventSeen]):
    """Session events of one agent stored together: the inputs of one `emit_each`.

    An input is built only when read one by one; a listener that takes the run whole
    (`Registration.each`) reads `agent` and `events` instead, and builds none.
    """

    __slots__ = ("agent", "events")

    def __init__(self, agent: SeamAgent, events: Sequence[ev.SessionEvent]) -> None:
        self.agent = agent
        self.events = events

    def __len__(self) -> int:
        return len(self.events)

    @overload
    def __getitem__(self, index: int) -> SessionEventSeen: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[SessionEventSeen]: ...
    def __getitem__(self, index: int | slice) -> SessionEventSeen | Sequence[SessionEventSeen]:
        if isinstance(index, slice):
            return SessionEventRun(self.agent, self.events[index])
        return SessionEventSeen(self.agent, self.events[index])

    def __iter__(self) -> Iterator[SessionEventSeen]:
        agent = self.agent
        return (SessionEventSeen(agent, event) for event in self.events)


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

ROUTES_KEPT = 4096
"""Agents whose route a seam keeps (then it starts over): the live ones, in practice."""

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
    applies: AgentFilter | None = None
    """Whether the listener concerns an agent's dispatches (None: every agent's); asked
    once per agent (`server.kernel.routes`)."""
    skip: Skip | None = None
    """Where a dispatch it sits out (`applies` said no) is counted."""
    wants: FacetFilter | None = None
    """Whether the listener concerns a dispatch of a facet (a tool's name, an event's
    kind) its caller names before the input is built (None: every facet's); asked once
    per agent and facet (`server.kernel.routes`)."""
    each: Callable[[Sequence[Any]], object] | None = None
    """An emit listener's form for a run of inputs (`emit_each`): `fn` over each, in
    one call (None: `fn` is called per input)."""

    def sort_key(self) -> tuple[int, str, int]:
        """Order number, then name, then registration order."""
        return (self.order, self.name, self.serial)


class SeamRegistry:
    """Listeners of every seam, in dispatch order."""

    def __init__(self) -> None:
        self._by_seam: dict[SeamKey, list[Registration[object]]] = {}
        self._routed: set[SeamKey] = set()
        """Seams with a listener scoped to an agent or concerning only some agents: their
        dispatches follow the agent's `Route`; the others need no filtering."""
        self._routes: dict[tuple[SeamKey, str | None, str | None], Route] = {}
        """The settled route of each routed seam and agent seen (dropped on any change):
        one look-up per dispatch, `self._routes.get((seam, agent_id, facet)) or self._route(...)`:
        a dispatch that names its facet (the tool called, the event's kind) has the route
        of that facet, past the listeners whose conditions exclude it."""
        self.heard: set[SeamKey] = set()
        """The seams with at least one listener (any agent's): a set lookup, not a call,
        lets a hot path skip a seam nobody listens to before asking `has`."""
        self.version = 0
        """Counts the changes of any seam's listeners: what a caller worked out from them
        (`wanted`) holds while this is unchanged."""
        self._counter = 0
        self.contained_failures = 0
        """How many emit listeners failed (each is logged too)."""
        self._tasks: set[asyncio.Future[object]] = set()

    def on(
        self, seam: Seam[Fn], fn: Fn, *, order: int = 0,
        name: str = "", agent_id: str | None = None, prepend: bool = False, origin: str = "",
        applies: AgentFilter | None = None, skip: Skip | None = None,
        wants: FacetFilter | None = None, each: Callable[[Sequence[Any]], object] | None = None,
    ) -> Callable[[], None]:  # fmt: skip
        """Register `fn` on `seam`; returns a disposer that removes it.

        `prepend` places the listener ahead of every ordinary one (order -10**9);
        `origin` is who it speaks for (`Registration.origin`). `applies` says which
        agents' dispatches concern it (asked once per agent); each dispatch it sits
        out is counted at `skip`, where the chain would have reached it; so is each one
        `wants` refuses, for a dispatch that names its facet. `each`, on an
        emit seam, is `fn` over a run of inputs in one call (`emit_each`).
        """
        self._counter += 1
        reg = Registration(
            seam, fn, -(10**9) if prepend else order, name, agent_id, self._counter, origin,
            applies, skip, wants, each,
        )  # fmt: skip
        listeners = [*self._by_seam.get(seam, []), reg]
        listeners.sort(key=Registration.sort_key)
        self._set(seam, listeners)

        def dispose() -> None:
            current = self._by_seam.get(seam, [])
            if reg in current:
                self._set(seam, [r for r in current if r is not reg])

        return dispose

    def remove_agent(self, agent_id: str) -> None:
        """Remove every listener scoped to `agent_id`, and forget its routes."""
        for seam, listeners in list(self._by_seam.items()):
            if any(r.agent_id == agent_id for r in listeners):
                self._set(seam, [r for r in listeners if r.agent_id != agent_id])
        self._routes = {key: found for key, found in self._routes.items() if key[1] != agent_id}

    def _set(self, seam: SeamKey, listeners: list[Registration[object]]) -> None:
        # Lists are replaced, never changed in place: a dispatch may hold the old one.
        self._by_seam[seam] = listeners
        self.version += 1
        self._routes = {key: found for key, found in self._routes.items() if key[0] is not seam}
        if listeners:
            self.heard.add(seam)
        else:
            self.heard.discard(seam)
        if any(
            r.agent_id is not None or r.applies is not None or r.wants is not None
            for r in listeners
        ):
            self._routed.add(seam)
        else:
            self._routed.discard(seam)

    def _route(self, seam: SeamKey, agent_id: str | None, facet: str | None = None) -> Route:
        """The route of `agent_id` and `facet` on a routed seam (kept once settled)."""
        found, settled = route(self._by_seam[seam], agent_id, facet)
        if settled:
            if len(self._routes) >= ROUTES_KEPT:
                self._routes.clear()
            self._routes[seam, agent_id, facet] = found
        return found

    def listeners(
        self, seam: Seam[Fn], agent_id: str | None, facet: str | None = None
    ) -> Sequence[Registration[Fn]]:
        """The listeners a dispatch of `seam` for `agent_id` calls, in order (read-only).

        Asking is dispatching: the listeners that sit out this agent's dispatches are
        counted (`Registration.skip`) as skipping it. Each was registered by `on`, which
        takes only a listener of the type the seam's key says: the return restores what
        the shared table forgot (an ignore, not a `cast`: no call per dispatch).
        """
        regs = self._by_seam.get(seam)
        if not regs:
            return []
        if seam in self._routed:
            found = self._routes.get((seam, agent_id, facet)) or self._route(seam, agent_id, facet)
            if found.skips is not None:
                found.count_all()
            return found.listeners  # type: ignore[return-value]
        # Unrouted: the list itself, which is never changed in place.
        return regs  # type: ignore[return-value]

    def wanted(self, seam: SeamKey, agent_id: str | None) -> frozenset[str] | None:
        """The facets a dispatch of `seam` for `agent_id` must name to reach a listener.

        None: any facet may (`server.kernel.routes.wanted`). Holds while `version` does.
        """
        return wanted(self._by_seam.get(seam, ()), agent_id)

    def has(
        self, seam: SeamKey, agent_id: str | None, facet: str | None = None, dispatches: int = 1
    ) -> bool:
        """Whether a dispatch of `seam` for `agent_id` would call a listener.

        Asked once per dispatch (or once for `dispatches` alike), in its place, before
        its input is built: when no listener runs for this agent, those sitting it out
        are counted skipping it now, as the dispatch would have counted them (it is
        not made).
        """
        if seam in self._routed:
            found = self._routes.get((seam, agent_id, facet)) or self._route(seam, agent_id, facet)
            if found.listeners:
                return True
            if found.skips is not None:  # `count_all`, inline: asked for every event
                for counts, key in found.skips[0]:  # the one entry: all sit out
                    counts[key] += dispatches
            return False
        return seam in self.heard

    async def waterfall(
        self, seam: Waterfall[In, Out], agent_id: str | None, build: Callable[[], In],
        default: Out, facet: str | None = None,
    ) -> Out:  # fmt: skip
        """Run the around-middleware chain over the input `build()` makes.

        The input is built only when a listener sees the dispatch: a seam without one
        costs a lookup, not an input object. The innermost `next()` returns the value
        the (possibly replaced) input carries when the seam says so
        (`Waterfall.carried`), else `default`.
        """
        if seam not in self._routed:
            regs = self._by_seam.get(seam)
            if not regs:
                return default
            return await _Chain(regs, default, seam.carried).run(0, build())  # type: ignore[arg-type]
        found = self._routes.get((seam, agent_id, facet)) or self._route(seam, agent_id, facet)
        if not found.listeners:
            if found.skips is not None:
                for counts, key in found.skips[0]:  # the one entry: all sit out
                    counts[key] += 1
            return default
        chain: _Chain[In, Out] = _Chain(found.listeners, default, seam.carried, found.skips)  # type: ignore[arg-type]
        return await chain.run(0, build())

    async def serial(
        self, seam: Serial[In, Out], agent_id: str | None, build: Callable[[], In],
        facet: str | None = None,
    ) -> Out | None:  # fmt: skip
        """Await each listener in order; return the first bail value, else None.

        The input is built by `build()`, only when a listener sees the dispatch.
        """
        regs: Sequence[Registration[SerialListener[In, Out]]]
        skips = None
        if seam in self._routed:
            found = self._routes.get((seam, agent_id, facet)) or self._route(seam, agent_id, facet)
            if not found.listeners:
                if found.skips is not None:
                    for counts, key in found.skips[0]:  # the one entry: all sit out
                        counts[key] += 1
                return None
            regs, skips = found.listeners, found.skips  # type: ignore[assignment]
        else:
            regs = self._by_seam.get(seam, ())  # type: ignore[assignment]
            if not regs:
                return None
        input = build()
        for index, reg in enumerate(regs):
            if skips is not None:
                for counts, key in skips[index]:
                    counts[key] += 1  # sat out just before this one: the chain got here
            result = reg.fn(input)
            if inspect.isawaitable(result):
                result = await result
            if result is not None and result is not False:
                return cast(Out, result)
        if skips is not None:
            for counts, key in skips[-1]:
                counts[key] += 1
        return None

    def emit(
        self, seam: Emit[In], agent_id: str | None, input: In, facet: str | None = None
    ) -> None:
        """Notify every listener; failures are logged and contained."""
        regs: Sequence[Registration[EmitListener[In]]]
        if seam in self._routed:  # `listeners`, inline: this runs for every session event
            found = self._routes.get((seam, agent_id, facet)) or self._route(seam, agent_id, facet)
            if found.skips is not None:
                for before in found.skips:
                    for counts, key in before:
                        counts[key] += 1
            regs = found.listeners  # type: ignore[assignment]
        else:
            regs = self._by_seam.get(seam, ())  # type: ignore[assignment]
            if not regs:
                return
        for reg in regs:
            try:
                result = reg.fn(input)
            except Exception:
                self._contain(seam, reg)
                continue
            if result is not None and inspect.iscoroutine(result):
                task: asyncio.Future[object] = asyncio.ensure_future(result)
                self._tasks.add(task)
                task.add_done_callback(functools.partial(self._settled, seam, reg))

    def emit_each(
        self, seam: Emit[In], agent_id: str | None, inputs: Sequence[In], facet: str | None = None
    ) -> None:
        """`emit` each of `inputs`, the route looked up once for the run.

        Each input is one dispatch, counted as such where a listener sits it out. Each
        listener sees the whole run before the next one does (as `SessionLog.published`
        tells its observers), in one call when it has an `each` form (a failure there
        is contained and ends that listener's run).
        """
        regs: Sequence[Registration[EmitListener[In]]]
        if seam in self._routed:
            found = self._routes.get((seam, agent_id, facet)) or self._route(seam, agent_id, facet)
            if found.skips is not None:
                for before in found.skips:
                    for counts, key in before:
                        counts[key] += len(inputs)
            regs = found.listeners  # type: ignore[assignment]
        else:
            regs = self._by_seam.get(seam, ())  # type: ignore[assignment]
        for reg in regs:
            if reg.each is not None:
                try:
                    reg.each(inputs)
                except Exception:
                    self._contain(seam, reg)
                continue
            fn = reg.fn
            for input in inputs:
                try:
                    result = fn(input)
                except Exception:
                    self._contain(seam, reg)
                    continue
                if result is not None and inspect.iscoroutine(result):
                    self._track(seam, reg, result)

    def _track(
        self, seam: SeamKey, reg: Registration[F], result: Coroutine[Any, Any, object]
    ) -> None:
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
