"""A turn leaves no reference cycles: everything it allocates is freed by reference counts.

A cycle per turn (a closure that calls itself, an object and a helper holding each other)
is garbage that only the cyclic collector frees: under load it makes the young generation
fill and the collector run more often. Counted, not timed: the collector's own count of
the unreachable objects it found after turns ran with it switched off.
"""

from __future__ import annotations

import gc
import tempfile

import pytest

from agentloop.v1 import agent_pb2
from agentloop.v1 import content_pb2 as c
from server.kernel import seams as S
from server.lifecycle.factory import AgentFactory
from server.lifecycle.runtime import build_runtime
from server.loop.agent import Agent
from server.settings.config import Config

# The benchmarks' turn: the scripted model asks for a tool call, the tool runs, a text.
OPTIONS = agent_pb2.AgentOptions(provider="scripted", model="bench", tools=["word_count"])
PROMPT = [c.ContentBlock(text=c.TextBlock(text="count the words of this short prompt"))]


async def one_turn(agent: Agent) -> None:
    agent.send(PROMPT)
    await agent.when_idle()


async def unreachable_after_turns(agent: Agent, turns: int = 20) -> int:
    """The unreachable objects the collector finds after `turns` turns ran without it
    (after five turns first: caches and first-time set-up are not per turn)."""
    for _ in range(5):
        await one_turn(agent)
    gc.collect()
    gc.disable()
    try:
        for _ in range(turns):
            await one_turn(agent)
        return gc.collect()
    finally:
        gc.enable()


def passes_on(input: object, next_: S.Next[object, object]) -> object:
    return next_()


@pytest.mark.parametrize(
    ("store", "listening"), [("memory", False), ("sqlite", False), ("memory", True)]
)
async def test_a_turn_with_a_tool_call_leaves_no_reference_cycles(
    store: str, listening: bool
) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        runtime = build_runtime(Config(store=store, data_dir=data_dir))
        factory = AgentFactory(runtime)
        if listening:  # a listener on every waterfall: each dispatch runs a chain
            for key in S.KEYS.values():
                if isinstance(key, S.Waterfall):
                    runtime.seams.on(key, passes_on)
        try:
            agent = await factory.create("a", OPTIONS)
            unreachable = await unreachable_after_turns(agent)
            assert agent.session.events[-1].WhichOneof("payload") == "turn_end"  # they ran
        finally:
            await factory.close()
            await runtime.store.close()
    assert unreachable == 0
