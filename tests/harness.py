"""A loop harness for unit tests: a real runtime and factory, no gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.lifecycle.factory import AgentFactory
from server.loop.agent import Agent
from server.loop.builtin_tools import builtin_tools
from server.loop.runtime import Runtime
from server.models import ModelRequest
from server.models.scripted import ScriptedModel
from server.models.scripted_options import script_options
from server.stores.memory import MemoryStore


class RecordingModel:
    """Wraps the scripted model and records every request it serves."""

    options_type = ScriptedModel.options_type

    def __init__(self) -> None:
        self.inner = ScriptedModel()
        self.requests: list[ModelRequest] = []

    def release(self, agent_id: str) -> None:
        self.inner.release(agent_id)

    async def stream(self, request: ModelRequest, signal: Any) -> Any:
        self.requests.append(request)
        async for chunk in self.inner.stream(request, signal):
            yield chunk


class Harness:
    """A runtime with the scripted model (recorded) and the built-in tools."""

    def __init__(self, **runtime_args: Any) -> None:
        runtime_args.setdefault("store", MemoryStore(persistent=True))
        # Unit tests inspect whole logs in memory; the bounded window has its own test.
        runtime_args.setdefault("event_window", 1_000_000)
        self.runtime = Runtime(**runtime_args)
        self.model = RecordingModel()
        self.runtime.models.register("scripted", self.model, default_model="echo")
        for tool in builtin_tools():
            self.runtime.tools.register(tool)
        self.factory = AgentFactory(self.runtime)
        self.status_traces: dict[str, list[int]] = {}
        self.agent_events: dict[str, list[ae.AgentEvent]] = {}
        self.created: list[Agent] = []
        self.all_status_traces: list[list[int]] = []

    async def create(
        self,
        agent_id: str = "a1",
        script: Sequence[scripted_pb2.ScriptedStep] = (),
        tools: Sequence[str] = (),
        **kwargs: Any,
    ) -> Agent:
        options = agent_pb2.AgentOptions(
            provider=kwargs.pop("provider", "scripted"),
            model=kwargs.pop("model", "test-model"),
            provider_options=script_options(script),
            tools=tools,
        )
        if "max_parallel_tool_calls" in kwargs:
            options.max_parallel_tool_calls = kwargs.pop("max_parallel_tool_calls")
        if "persona" in kwargs:
            options.persona = kwargs.pop("persona")
        setup = kwargs.pop("setup", None)

        async def record(agent: Agent) -> None:
            # A later agent with the same id gets fresh records; every trace is checked.
            trace = self.status_traces[agent.agent_id] = []
            self.all_status_traces.append(trace)
            events = self.agent_events[agent.agent_id] = []

            def on_event(event: ae.AgentEvent) -> None:
                events.append(event)
                if event.WhichOneof("event") == "status":
                    trace.append(event.status.status)

            agent.subscribe(on_event)
            if setup is not None:
                await setup(agent)

        agent = await self.factory.create(agent_id, options, setup=record, **kwargs)
        self.created.append(agent)
        return agent

    async def turn(self, agent: Agent, text: str) -> None:
        """Send `text` and wait until the agent is idle again."""
        agent.send([text_block(text)])
        await asyncio.wait_for(agent.when_idle(), 10)


def text_block(text: str) -> c.ContentBlock:
    return c.ContentBlock(text=c.TextBlock(text=text))


def kinds(agent: Agent, start: int = 0) -> list[str]:
    """The payload kinds of the agent's log from `start`."""
    return [e.WhichOneof("payload") or "" for e in agent.session.events[start:]]


def boundaries(agent: Agent) -> list[str]:
    """The turn and step boundaries of the log, in order."""
    keep = {"turn_start", "step_start", "step_end", "turn_end"}
    return [k for k in kinds(agent) if k in keep]


def turn_ends(agent: Agent) -> list[ev.TurnEndReason]:
    """The reasons of every `turn/end`."""
    return [e.turn_end.reason for e in agent.session.events if e.HasField("turn_end")]


def reason_kinds(agent: Agent) -> list[str]:
    """The reason kinds of every `turn/end`."""
    return [r.WhichOneof("kind") or "" for r in turn_ends(agent)]


def text_step(text: str, **kwargs: Any) -> scripted_pb2.ScriptedStep:
    """A scripted step that streams `text`."""
    return scripted_pb2.ScriptedStep(text=text, **kwargs)


def tool_step(*calls: tuple[str, str], text: str = "", **kwargs: Any) -> scripted_pb2.ScriptedStep:
    """A scripted step that calls tools: (name, arguments JSON) pairs."""
    return scripted_pb2.ScriptedStep(
        text=text,
        tool_calls=[
            scripted_pb2.ScriptedToolCall(id=f"c{i + 1}", name=name, arguments=args)
            for i, (name, args) in enumerate(calls)
        ],
        **kwargs,
    )


MAX_TOKENS = st.FINISH_KIND_MAX_TOKENS
ERROR = st.FINISH_KIND_ERROR
