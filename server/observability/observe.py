"""Turn, step, model and tool timings read off the session log, for metrics and traces.

The loop already records everything observable as session events, appended in order
as it happens; `EventClock` listens to `session/event` (in-process, at the append) and
turns those events into starts and ends with durations, which it hands to each `Sink`.
Nothing is registered unless metrics or traces are on, so they cost nothing when off.

This runs for every appended event, chunks included, so it is kept lean: the kind of
an event comes from its session (`SessionLog.publishing`: no protobuf call), a table by
kind picks the one handler of an event (the kinds nobody measures cost a look-up), a
chunk is handled inline (the first of a model call is timed, the last kept for its
finish), the clock is read once per event at most, what a model call's message says
is read once for every sink, and a sink's method is called only when the sink
implements it (a `Sink` overrides only what it measures).

Two things the log does not hold come through hooks: plugin calls (`plugin_call`) and
store commits (`store_commit`). Each hook is a module global that is None when off.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from agentloop.v1.approval_pb2 import ApprovalRequested, ApprovalResolved
from agentloop.v1.content_pb2 import ModelConfig
from server.kernel import seams as S
from server.kernel.seams import SeamRegistry

FINISH_REASONS = {
    st.FINISH_KIND_STOP: "stop",
    st.FINISH_KIND_MAX_TOKENS: "length",
    st.FINISH_KIND_ERROR: "error",
    st.FINISH_KIND_ABORTED: "aborted",
}
"""Finish kinds as the GenAI conventions name finish reasons."""


@dataclass(slots=True)
class Model:
    """One model call: from the step's start (or its request header) to its message."""

    start_ns: int
    first_chunk_ns: int = 0
    finish: str = ""
    """The finish reason (see `FINISH_REASONS`), once the call ended with one."""
    last_chunk: ev.SessionEvent | None = None
    """The call's latest chunk: a finish, once the stream is whole (nothing follows it)."""
    usage: tuple[int, int] | None = None
    """The input and output tokens, when the model reported them."""

    def ended(self, message: ev.AssistantMessage | None) -> Model:
        """The call, ended with `message` (None: failed), read once for every sink.

        Its finish comes off its last chunk (none when the stream was cut).
        """
        if self.last_chunk is not None:
            kind = self.last_chunk.assistant_chunk.chunk.finish.kind  # 0: not a finish
            if kind:
                self.finish = FINISH_REASONS.get(kind, "unknown")
            self.last_chunk = None
        if message is not None and message.HasField("usage"):
            usage = message.usage
            self.usage = (usage.input_tokens, usage.output_tokens)
        return self


@dataclass(slots=True)
class Step:
    """One open step."""

    turn: int
    step: int
    start_ns: int
    model: Model | None = None
    tools: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Open tool calls: call id -> (tool name, start)."""


@dataclass(slots=True)
class Turn:
    """One open turn of one agent."""

    agent: str
    session: str
    turn: int
    start_ns: int
    step: Step | None = None


class Sink:
    """Receives what `EventClock` measured; every method is called on the event loop.

    Each method does nothing here: a sink overrides those it needs, and the clock
    calls only the overridden ones.
    """

    def turn_start(self, turn: Turn) -> None:
        """A turn opened."""

    def turn_end(self, turn: Turn, reason: str, end_ns: int) -> None:
        """A turn ended for `reason` (completed, max_tokens, aborted, error, ...)."""

    def step_start(self, turn: Turn, step: Step) -> None:
        """A step opened."""

    def step_end(self, turn: Turn, step: Step, end_ns: int) -> None:
        """A step closed."""

    def model_start(self, turn: Turn, step: Step, model: Model) -> None:
        """A model call started."""

    def first_chunk(self, turn: Turn, step: Step, model: Model) -> None:
        """The model's first chunk arrived."""

    def model_end(
        self, turn: Turn, step: Step, model: Model, message: ev.AssistantMessage | None, end_ns: int
    ) -> None:
        """A model call ended; `message` is None when it failed."""

    def tool_start(self, turn: Turn, step: Step, call: ev.ToolCall, start_ns: int) -> None:
        """A tool call started."""

    def tool_end(
        self, turn: Turn, step: Step, result: ev.ToolResult, name: str, start_ns: int, end_ns: int
    ) -> None:
        """A tool call's result was recorded."""

    def model_config(self, agent: str, config: ModelConfig) -> None:
        """The agent's model configuration is new or changed (its request header was logged)."""

    def approval_requested(self, agent: str, requested: ApprovalRequested, now_ns: int) -> None:
        """A tool call started to wait for approval."""

    def approval_resolved(self, agent: str, resolved: ApprovalResolved, now_ns: int) -> None:
        """An approval was answered, cancelled or timed out."""


def _overridden(sinks: list[Sink], method: str) -> list[Callable[..., None]]:
    """The bound `method` of each sink that overrides it."""
    plain = getattr(Sink, method)
    return [getattr(sink, method) for sink in sinks if getattr(type(sink), method) is not plain]


class EventClock:
    """Session events in, timings out to the sinks."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self.turns: dict[str, Turn] = {}
        """The open turn of each agent."""
        # The sinks' methods to call, bound once: for each, those that do something.
        self._turn_start = _overridden(sinks, "turn_start")
        self._turn_end = _overridden(sinks, "turn_end")
        self._step_start = _overridden(sinks, "step_start")
        self._step_end = _overridden(sinks, "step_end")
        self._model_start = _overridden(sinks, "model_start")
        self._first_chunk = _overridden(sinks, "first_chunk")
        self._model_end = _overridden(sinks, "model_end")
        self._tool_start = _overridden(sinks, "tool_start")
        self._tool_end = _overridden(sinks, "tool_end")
        self._model_config = _overridden(sinks, "model_config")
        self._approval_requested = _overridden(sinks, "approval_requested")
        self._approval_resolved = _overridden(sinks, "approval_resolved")
        self._handlers: dict[str | None, Callable[[Any, ev.SessionEvent], None]] = {
            "turn_start": self._on_turn_start,
            "step_start": self._on_step_start,
            "assistant_message": self._on_message,
            "tool_call": self._on_tool_call,
            "tool_result": self._on_tool_result,
            "step_end": self._on_step_end,
            "turn_end": self._on_turn_end,
            "request_header": self._on_request_header,
            "approval_requested": self._on_approval_requested,
            "approval_resolved": self._on_approval_resolved,
        }
        """The handler of each payload kind measured (chunks aside); the others are ignored."""

    def install(self, seams: SeamRegistry) -> Callable[[], None]:
        """Listen to every agent's appended events; returns the disposer."""
        return seams.on(
            S.SESSION_EVENT,
            lambda seen: self.observe(seen.agent, seen.event),
            name="observability",
            prepend=True,
        )

    def observe(self, agent: Any, event: ev.SessionEvent) -> None:
        """One appended event of `agent`, as its session publishes it."""
        # The session says the kind: cheaper than asking the event (a string made anew).
        kind = agent.session.publishing or event.WhichOneof("payload")
        if kind != "assistant_chunk":
            handler = self._handlers.get(kind)
            if handler is not None:
                handler(agent, event)
            return
        # A chunk, the most frequent event, handled here: the first of a model call is
        # timed, the latest is kept for its finish (the last chunk of a whole stream).
        turn = self.turns.get(agent.agent_id)
        step = turn.step if turn is not None else None
        model = step.model if step is not None else None
        if model is None:
            return
        model.last_chunk = event
        if not model.first_chunk_ns:
            model.first_chunk_ns = time.time_ns()
            for call in self._first_chunk:
                call(turn, step, model)

    def _on_turn_start(self, agent: Any, event: ev.SessionEvent) -> None:
        agent_id: str = agent.agent_id
        turn = Turn(agent_id, agent.session.session_id, event.turn_start.turn, time.time_ns())
        self.turns[agent_id] = turn
        for call in self._turn_start:
            call(turn)

    def _on_step_start(self, agent: Any, event: ev.SessionEvent) -> None:
        turn = self.turns.get(agent.agent_id)
        if turn is None:
            return
        now = time.time_ns()
        step = turn.step = Step(turn.turn, event.step_start.step, now, Model(now))
        for call in self._step_start:
            call(turn, step)
        for call in self._model_start:
            call(turn, step, step.model)

    def _on_message(self, agent: Any, event: ev.SessionEvent) -> None:
        turn = self.turns.get(agent.agent_id)
        step = turn.step if turn is not None else None
        if step is None or step.model is None:
            return
        now = time.time_ns()
        message = event.assistant_message
        model, step.model = step.model.ended(message), None
        for call in self._model_end:
            call(turn, step, model, message, now)

    def _on_tool_call(self, agent: Any, event: ev.SessionEvent) -> None:
        turn = self.turns.get(agent.agent_id)
        step = turn.step if turn is not None else None
        if step is None:
            return
        now = time.time_ns()
        call_event = event.tool_call
        step.tools[call_event.call_id] = (call_event.name, now)
        for call in self._tool_start:
            call(turn, step, call_event, now)

    def _on_tool_result(self, agent: Any, event: ev.SessionEvent) -> None:
        turn = self.turns.get(agent.agent_id)
        step = turn.step if turn is not None else None
        if step is None:
            return
        now = time.time_ns()
        result = event.tool_result
        name, started = step.tools.pop(result.call_id, ("", now))
        for call in self._tool_end:
            call(turn, step, result, name, started, now)

    def _on_request_header(self, agent: Any, event: ev.SessionEvent) -> None:
        for call in self._model_config:
            call(agent.agent_id, event.request_header.header.config)

    def _on_approval_requested(self, agent: Any, event: ev.SessionEvent) -> None:
        now = time.time_ns()
        for call in self._approval_requested:
            call(agent.agent_id, event.approval_requested, now)

    def _on_approval_resolved(self, agent: Any, event: ev.SessionEvent) -> None:
        now = time.time_ns()
        for call in self._approval_resolved:
            call(agent.agent_id, event.approval_resolved, now)

    def _on_step_end(self, agent: Any, event: ev.SessionEvent) -> None:
        turn = self.turns.get(agent.agent_id)
        if turn is not None and turn.step is not None:
            self._end_step(turn, turn.step, time.time_ns())

    def _on_turn_end(self, agent: Any, event: ev.SessionEvent) -> None:
        agent_id: str = agent.agent_id
        turn = self.turns.pop(agent_id, None)
        if turn is None:
            return
        now = time.time_ns()
        if turn.step is not None:
            self._end_step(turn, turn.step, now)
        reason = event.turn_end.reason.WhichOneof("kind") or "unknown"
        for call in self._turn_end:
            call(turn, reason, now)

    def _end_step(self, turn: Turn, step: Step, now: int) -> None:
        if step.model is not None:  # the call failed or was cut: no message came
            model, step.model = step.model.ended(None), None
            for model_end in self._model_end:
                model_end(turn, step, model, None, now)
        turn.step = None
        for call in self._step_end:
            call(turn, step, now)


# -- hooks for what the log does not hold ------------------------------------------------


class TraceCarrier(Protocol):
    """Where a plugin call carries its W3C trace context (a `HookCall`)."""

    traceparent: str
    tracestate: str


class PluginCallObserver(Protocol):
    """Wraps one call to a plugin."""

    def __call__(
        self,
        plugin: str,
        seam: str,
        agent: str,
        turn: int,
        step: int,
        carrier: TraceCarrier | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """A context around the call; an exception leaving it is the call's failure.

        `carrier` (the call, before it is sent) receives the trace context of the call.
        """
        ...


PLUGIN_CALL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
)  # fmt: skip
"""Upper bounds (seconds) of the plugin call histogram's buckets, +Inf aside: from a
local hop to a tool that works for a while (the plugin's stats count into them)."""

plugin_call: PluginCallObserver | None = None
"""Set while metrics or traces are on."""
store_commit: Callable[[float], None] | None = None
"""Called with the seconds of each group commit while metrics are on."""
model_retry: Callable[[str, str], None] | None = None
"""Called with the provider and the cause each time a model request is sent again."""

_NOTHING = contextlib.nullcontext()


def plugin_call_scope(
    plugin: str, seam: str, agent: str, turn: int, step: int, carrier: TraceCarrier | None = None
) -> contextlib.AbstractContextManager[None]:
    """What a plugin call runs in: nothing when observability is off.

    With tracing on, `carrier` (the `HookCall`) gets the `traceparent` of the call's span.
    """
    observer = plugin_call
    return _NOTHING if observer is None else observer(plugin, seam, agent, turn, step, carrier)


@contextlib.contextmanager
def timed(callback: Callable[[float, BaseException | None], None]) -> Iterator[None]:
    """Run the block and report its duration and its exception (or None)."""
    started = time.perf_counter()
    try:
        yield
    except BaseException as error:
        callback(time.perf_counter() - started, error)
        raise
    callback(time.perf_counter() - started, None)
