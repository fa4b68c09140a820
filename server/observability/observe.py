"""Turn, step, model and tool timings read off the session log, for metrics and traces.

The loop already records everything observable as session events, appended in order
as it happens; `EventClock` listens to `session/event` (in-process, at the append) and
turns those events into starts and ends with durations, which it hands to each `Sink`.
Nothing is registered unless metrics or traces are on, so they cost nothing when off.

Two things the log does not hold come through hooks: plugin calls (`plugin_call`) and
store commits (`store_commit`). Each hook is a module global that is None when off.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.core import seams as S
from server.core.seams import SeamRegistry

_SINK_METHODS = (
    "turn_start", "turn_end", "step_start", "step_end", "model_start", "first_chunk",
    "model_end", "tool_start", "tool_end",
)  # fmt: skip

FINISH_REASONS = {
    st.FINISH_KIND_STOP: "stop",
    st.FINISH_KIND_MAX_TOKENS: "length",
    st.FINISH_KIND_ERROR: "error",
    st.FINISH_KIND_ABORTED: "aborted",
}
"""Finish kinds as the GenAI conventions name finish reasons."""


@dataclass
class Model:
    """One model call: from the step's start (or its request header) to its message."""

    start_ns: int
    first_chunk_ns: int = 0
    finish: str = ""


@dataclass
class Step:
    """One open step."""

    turn: int
    step: int
    start_ns: int
    model: Model | None = None
    tools: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Open tool calls: call id -> (tool name, start)."""


@dataclass
class Turn:
    """One open turn of one agent."""

    agent: str
    session: str
    turn: int
    start_ns: int
    step: Step | None = None


class Sink(Protocol):
    """Receives what `EventClock` measured; every method is called on the event loop."""

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


class EventClock:
    """Session events in, timings out to the sinks."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self.turns: dict[str, Turn] = {}
        """The open turn of each agent."""
        # Bound once: this runs for every appended event, chunks included.
        self._calls: dict[str, list[Callable[..., None]]] = {
            name: [getattr(sink, name) for sink in sinks] for name in _SINK_METHODS
        }

    def install(self, seams: SeamRegistry) -> Callable[[], None]:
        """Listen to every agent's appended events; returns the disposer."""
        return seams.on(
            S.SESSION_EVENT,
            lambda seen: self.observe(seen.agent, seen.event),
            name="observability",
            prepend=True,
        )

    def observe(self, agent: Any, event: ev.SessionEvent) -> None:
        """One appended event of `agent`."""
        kind = event.WhichOneof("payload")
        agent_id: str = agent.agent_id
        if kind == "assistant_chunk":  # the most frequent event: only two cases matter
            open_turn = self.turns.get(agent_id)
            step_now = open_turn.step if open_turn is not None else None
            if step_now is None or step_now.model is None:
                return
            chunk = event.assistant_chunk.chunk
            if step_now.model.first_chunk_ns and not chunk.HasField("finish"):
                return
            assert open_turn is not None
            self._chunk(open_turn, step_now, chunk, time.time_ns())
            return
        now = time.time_ns()
        if kind == "turn_start":
            turn = Turn(agent_id, agent.session.session_id, event.turn_start.turn, now)
            self.turns[agent_id] = turn
            self._each("turn_start", turn)
            return
        turn_or_none = self.turns.get(agent_id)
        if turn_or_none is None:
            return
        turn = turn_or_none
        step = turn.step
        if kind == "step_start":
            turn.step = Step(turn.turn, event.step_start.step, now)
            turn.step.model = Model(now)
            self._each("step_start", turn, turn.step)
            self._each("model_start", turn, turn.step, turn.step.model)
            return
        if step is None:
            if kind == "turn_end":
                self._end_turn(agent_id, turn, event.turn_end, now)
            return
        match kind:
            case "assistant_message" if step.model is not None:
                model, step.model = step.model, None
                self._each("model_end", turn, step, model, event.assistant_message, now)
            case "tool_call":
                call = event.tool_call
                step.tools[call.call_id] = (call.name, now)
                self._each("tool_start", turn, step, call, now)
            case "tool_result":
                name, started = step.tools.pop(event.tool_result.call_id, ("", now))
                self._each("tool_end", turn, step, event.tool_result, name, started, now)
            case "step_end":
                self._end_step(turn, step, now)
            case "turn_end":
                self._end_step(turn, step, now)
                self._end_turn(agent_id, turn, event.turn_end, now)

    def _chunk(self, turn: Turn, step: Step, chunk: st.StreamChunk, now: int) -> None:
        model = step.model
        if model is None:
            return
        if not model.first_chunk_ns:
            model.first_chunk_ns = now
            self._each("first_chunk", turn, step, model)
        if chunk.HasField("finish"):
            model.finish = FINISH_REASONS.get(chunk.finish.kind, "unknown")

    def _end_step(self, turn: Turn, step: Step, now: int) -> None:
        if step.model is not None:  # the call failed or was cut: no message came
            model, step.model = step.model, None
            self._each("model_end", turn, step, model, None, now)
        turn.step = None
        self._each("step_end", turn, step, now)

    def _end_turn(self, agent_id: str, turn: Turn, end: ev.TurnEnd, now: int) -> None:
        del self.turns[agent_id]
        self._each("turn_end", turn, end.reason.WhichOneof("kind") or "unknown", now)

    def _each(self, method: str, *args: Any) -> None:
        for call in self._calls[method]:
            call(*args)


def usage_of(message: ev.AssistantMessage | None) -> c.Usage | None:
    """The token usage of a model message, when the model reported it."""
    return message.usage if message is not None and message.HasField("usage") else None


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


plugin_call: PluginCallObserver | None = None
"""Set while metrics or traces are on."""
store_commit: Callable[[float], None] | None = None
"""Called with the seconds of each group commit while metrics are on."""

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
