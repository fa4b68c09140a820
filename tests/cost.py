"""What a turn costs, counted in units the machine does not change.

    python -m tests.cost            # print every figure beside its budget

A timing moves with the machine and its other load; these counts do not (or hardly):
Python function calls per turn (cProfile's count, the main thread), bytes a turn keeps
and the most it holds at once (tracemalloc), session events per turn, stream messages
and bytes per turn over gRPC, the server's function calls per turn over gRPC (the
loop's and the edge's: a server process of its own, profiled), and the modules and
resident memory of a server started on its defaults. The workload is the benchmarks'
(`bench/loop_bench.py`): the scripted model asks for one tool call (`word_count`), the
tool runs, the model answers with a short text; two steps, one tool, one conversation.

`tests/test_cost_budget.py` holds each figure to its budget in `tests/cost_budgets.toml`.
The call count is the same in every run (the time-based fairness yields are off); the
byte counts move a little with timestamps' varint sizes, RSS with the allocator: each
budget keeps a little headroom over what it was set at.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import json
import math
import os
import pstats
import signal
import subprocess
import sys
import tomllib
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentloop.v1 import agent_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import content_pb2 as c
from server.kernel import fairness
from server.lifecycle.factory import AgentFactory
from server.lifecycle.runtime import build_runtime
from server.loop.agent import Agent
from server.settings.config import Config

BUDGETS = Path(__file__).with_name("cost_budgets.toml")
ROOT = Path(__file__).resolve().parent.parent
OPTIONS = agent_pb2.AgentOptions(provider="scripted", model="bench", tools=["word_count"])
PROMPT = [c.ContentBlock(text=c.TextBlock(text="count the words of this short prompt"))]
WARM_TURNS = 5
TURNS = 40


@dataclass(frozen=True)
class Budget:
    """One figure's ceiling, with when and at which commit it was set and why."""

    name: str
    limit: float
    unit: str
    set_on: str
    commit: str
    why: str


def budgets() -> dict[str, Budget]:
    """The budgets of `cost_budgets.toml`, by figure name."""
    with BUDGETS.open("rb") as f:
        table = tomllib.load(f)
    return {
        name: Budget(
            name=name,
            limit=float(entry["limit"]),
            unit=str(entry["unit"]),
            set_on=str(entry["set_on"]),
            commit=str(entry["commit"]),
            why=str(entry["why"]),
        )
        for name, entry in table.items()
    }


async def _turn(agent: Agent) -> None:
    agent.send(PROMPT)
    await agent.when_idle()


async def _conversation(measure: Callable[[Agent], object]) -> None:
    """Warm a conversation up on the memory store, then run `measure` on its agent.

    The fairness yields (`server/kernel/fairness.py`) come after a stretch of wall
    time, so a slower or busier machine yields more often; they are off here, so that
    the counts depend on the code alone.
    """
    fairness.SLICE = math.inf
    runtime = build_runtime(Config(store="memory"))
    factory = AgentFactory(runtime)
    try:
        agent = await factory.create("cost", OPTIONS)
        for _ in range(WARM_TURNS):
            await _turn(agent)
        result = measure(agent)
        if asyncio.iscoroutine(result):
            await result
    finally:
        await factory.close()
        await runtime.store.close()


def in_process_calls() -> dict[str, float]:
    """Function calls and session events per turn, in process, memory store."""
    figures: dict[str, float] = {}

    async def measure(agent: Agent) -> None:
        before = len(agent.session)
        profile = cProfile.Profile()
        gc.collect()
        profile.enable()
        for _ in range(TURNS):
            await _turn(agent)
        profile.disable()
        figures["calls_per_turn"] = pstats.Stats(profile).total_calls / TURNS  # type: ignore[attr-defined]
        figures["events_per_turn"] = (len(agent.session) - before) / TURNS

    asyncio.run(_conversation(measure))
    return figures


def in_process_memory() -> dict[str, float]:
    """Bytes a turn keeps (the conversation grows) and the most one holds above that."""
    figures: dict[str, float] = {}

    async def measure(agent: Agent) -> None:
        gc.collect()
        tracemalloc.start()
        try:
            start, _ = tracemalloc.get_traced_memory()
            held = 0
            for _ in range(TURNS):
                before, _ = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                await _turn(agent)
                _, peak = tracemalloc.get_traced_memory()
                held = max(held, peak - before)
            gc.collect()
            end, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        figures["kept_bytes_per_turn"] = (end - start) / TURNS
        figures["held_bytes_per_turn"] = float(held)

    asyncio.run(_conversation(measure))
    return figures


def over_grpc() -> dict[str, float]:
    """Stream messages and bytes per turn of one agent's session stream, over gRPC."""
    from agentloop import client as facade
    from server.edge.app import App

    figures: dict[str, float] = {}

    async def run() -> None:
        app = App(Config(listen="127.0.0.1:0", store="memory", agents=()))
        port = await app.start()
        client = facade.connect(f"127.0.0.1:{port}")
        try:
            await client.create("cost", OPTIONS)
            async with client.conversation("cost") as chat:
                for _ in range(WARM_TURNS):
                    await (await chat.send("count the words of this short prompt")).result()
            idle = await client.agents.WaitIdle(api.WaitIdleRequest(agent_id="cost"))
            stream = client.agents.StreamSessionEvents(
                api.StreamSessionEventsRequest(agent_id="cost", from_seq=idle.next_seq)
            )
            messages = size = 0
            async with asyncio.timeout(60):
                for _ in range(TURNS):  # a live conversation: send, read the turn to its end
                    await client.agents.SendMessage(
                        api.SendMessageRequest(agent_id="cost", text="count these words")
                    )
                    ended = False
                    while not ended:
                        response = await stream.read()
                        assert isinstance(response, api.StreamSessionEventsResponse)
                        messages += 1
                        size += response.ByteSize()
                        ended = any(e.HasField("turn_end") for e in response.events)
            stream.cancel()
            figures["stream_messages_per_turn"] = messages / TURNS
            figures["stream_bytes_per_turn"] = size / TURNS
        finally:
            await client.close()
            await app.stop(grace=0)

    asyncio.run(run())
    return figures


_SERVER = """
import asyncio, cProfile, json, math, pstats, shutil, signal, sys, tempfile
from server.edge import event_loop
from server.edge.app import App
from server.kernel import fairness
from server.settings.config import Config

async def main():
    fairness.SLICE = math.inf  # as in process: the counts depend on the code alone
    store, profile_path = sys.argv[1], sys.argv[2]
    data_dir = tempfile.mkdtemp(prefix="agentloop-cost-")
    app = App(Config(listen="127.0.0.1:0", store=store, data_dir=data_dir, agents=()))
    port = await app.start()
    profile, done = cProfile.Profile(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def start():
        profile.enable()
        print("profiling", flush=True)

    def stop():
        profile.disable()
        done.set()

    loop.add_signal_handler(signal.SIGUSR1, start)
    loop.add_signal_handler(signal.SIGUSR2, stop)
    print(port, flush=True)
    await done.wait()
    await app.stop(grace=5)  # the agent is idle: it stops at once
    shutil.rmtree(data_dir, ignore_errors=True)
    stats = pstats.Stats(profile)
    if profile_path:
        stats.dump_stats(profile_path)
    print(json.dumps({"calls": stats.total_calls}), flush=True)
    return 0

event_loop.run(main(), Config().event_loop)  # the server's own loop
"""


def grpc_server_calls(profile: str = "", store: str = "memory") -> dict[str, float]:
    """The server's function calls per turn over gRPC: a message sent, its stream read.

    The server runs in a process of its own (the client's calls are not counted), on
    the memory store, profiled from the first measured turn to the last; the client is
    a raw stub (`bench/turn_ab.py`'s), so the figure is what the edge and the loop
    cost the server for one turn of one agent. `profile` keeps the server's profile;
    `store` is another store to measure on (the figure is the memory store's: the
    SQLite store's commits add loop passes that depend on its thread's timing).
    """
    import grpc

    from agentloop.v1 import agent_factory_service_pb2 as fac
    from agentloop.v1 import agent_factory_service_pb2_grpc as fac_rpc
    from agentloop.v1 import agent_service_pb2_grpc as api_rpc

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENTLOOP_"))}
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, store, profile],
        cwd=ROOT,
        env=dict(env, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    try:
        port = int(server.stdout.readline())

        async def run() -> None:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                factory = fac_rpc.AgentFactoryServiceStub(channel)
                agents = api_rpc.AgentServiceStub(channel)
                await factory.CreateAgent(fac.CreateAgentRequest(agent_id="cost", options=OPTIONS))
                stream = agents.StreamSessionEvents(api.StreamSessionEventsRequest(agent_id="cost"))
                request = api.SendMessageRequest(agent_id="cost", text="count these words")

                async def turn() -> None:
                    await agents.SendMessage(request)
                    while True:
                        batch = await stream.read()
                        assert isinstance(batch, api.StreamSessionEventsResponse)
                        if any(event.HasField("turn_end") for event in batch.events):
                            return

                for _ in range(WARM_TURNS):
                    await turn()
                server.send_signal(signal.SIGUSR1)
                assert server.stdout is not None
                await asyncio.to_thread(server.stdout.readline)  # "profiling"
                for _ in range(TURNS):
                    await turn()
                server.send_signal(signal.SIGUSR2)
                stream.cancel()

        asyncio.run(asyncio.wait_for(run(), 120))
        calls = json.loads(server.stdout.readline())["calls"]
        server.wait(30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return {"grpc_server_calls_per_turn": calls / TURNS}


_STARTUP = """
import json, sys, tempfile
from server.edge import event_loop
from server.edge.app import App
from server.memory import freeze_startup_heap
from server.settings.config import load_config, override

async def main(data_dir):
    config = override(load_config(None), listen="127.0.0.1:0", data_dir=data_dir)
    app = App(config)
    await app.start()
    freeze_startup_heap()  # as `server.__main__.serve` does once started
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    print(json.dumps({"startup_modules": len(sys.modules), "startup_rss_mb": rss / 1024}))
    await app.stop(grace=0)

with tempfile.TemporaryDirectory() as data_dir:
    event_loop.run(main(data_dir), load_config(None).event_loop)  # the server's own loop
"""


def startup() -> dict[str, float]:
    """Modules imported and resident memory of a server started on its defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENTLOOP_"))}
    out = subprocess.run(
        [sys.executable, "-c", _STARTUP],
        cwd=ROOT,
        env=dict(env, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


MEASURES: tuple[Callable[[], dict[str, float]], ...] = (
    in_process_calls,
    in_process_memory,
    over_grpc,
    grpc_server_calls,
    startup,
)


def measure_all() -> dict[str, float]:
    """Every figure, by name."""
    figures: dict[str, float] = {}
    for measure in MEASURES:
        figures.update(measure())
    return figures


def main() -> None:
    """Print every figure beside its budget, or (`--json`) the figures alone."""
    figures = measure_all()
    if sys.argv[1:] == ["--json"]:
        print(json.dumps(figures))
        return
    limits = budgets()
    for name, value in figures.items():
        budget = limits.get(name)
        limit = f"{budget.limit:>10,.1f} {budget.unit}" if budget else "(no budget)"
        share = f"{value / budget.limit:6.1%}" if budget else ""
        print(f"{name:<26} {value:>10,.1f}   budget {limit:<22} {share}")


if __name__ == "__main__":
    main()
