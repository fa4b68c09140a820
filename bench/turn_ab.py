"""The turn's cost, A/B: this tree against other checkouts, in one run.

    python -m bench.turn_ab [--turns 300] [--repeat 3] [--against DIR ...]

Four figures of the benchmark workload (a tool call, the tool, a short text: two steps),
each the median of `--repeat` fresh processes per checkout, the checkouts interleaved in
each round so that the machine's load spreads over all of them:

- the in-process turn on the memory store: one conversation of `--turns` turns, wall
  µs per turn (after 20 warm-up turns on another agent);
- the same conversation on SQLite, durable (every event stored before it is seen);
- one agent over gRPC: a server of the checkout on its defaults (SQLite) in a
  subprocess, a raw-stub client sending a message and reading its session stream to the
  turn's `turn_end`, µs per turn;
- the peak RSS of the in-process memory-store process.

Beside each wall time, the CPU time (of the process, or of the gRPC server): on a loaded
machine it moves less than the wall time does.

Each other checkout is a directory of the tree (a `git worktree` or `git archive` of a
commit); its server and SDK run under this interpreter, so it must install nothing
this one lacks. Workers import the server's parts where each checkout keeps them (the
layout moved). Figures are printed, never asserted, with each checkout's ratio to the
first `--against`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import shutil
import sys
import tempfile
import time
from typing import Any

from bench import common

FIGURES = {
    "memory_us": "in-process turn, memory store (µs)",
    "memory_cpu_us": "  its CPU (µs)",
    "sqlite_us": "in-process conversation turn, SQLite (µs)",
    "sqlite_cpu_us": "  its CPU (µs)",
    "grpc_us": "one agent over gRPC (µs)",
    "grpc_server_cpu_us": "  the server's CPU (µs)",
    "peak_rss_mb": "peak RSS, in-process memory-store process (MB)",
}
WARM = 20


def _part(*names: str) -> Any:
    """The first of `module:attribute` names that imports (the layout moved over time)."""
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {names}")


async def in_process(store: str, turns: int) -> tuple[float, float]:
    """Wall and CPU µs per turn of one conversation of `turns` turns on `store`."""
    build_runtime = _part("server.lifecycle.runtime:build_runtime", "server.app:build_runtime")
    factory_type = _part("server.lifecycle.factory:AgentFactory", "server.factory:AgentFactory")
    config_type = _part("server.settings.config:Config", "server.config:Config")
    with tempfile.TemporaryDirectory() as data_dir:
        runtime = build_runtime(config_type(store=store, data_dir=data_dir))
        factory = factory_type(runtime)
        warm = await factory.create("warm", common.OPTIONS)
        for _ in range(WARM):
            await common.one_turn(warm)
        agent = await factory.create("conversation", common.OPTIONS)
        gc.collect()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(turns):
            await common.one_turn(agent)
        per_turn = (time.perf_counter() - start) / turns * 1e6
        cpu_per_turn = (time.process_time() - cpu) / turns * 1e6
        await factory.close()
        await runtime.store.close()
    return per_turn, cpu_per_turn


async def over_grpc(turns: int) -> tuple[float, float]:
    """Wall µs per turn of one agent over gRPC, and the server's CPU µs per turn."""
    import grpc

    from agentloop.v1 import agent_factory_service_pb2 as fac
    from agentloop.v1 import agent_factory_service_pb2_grpc as fac_rpc
    from agentloop.v1 import agent_service_pb2 as api
    from agentloop.v1 import agent_service_pb2_grpc as api_rpc

    port = common.free_port()
    data_dir = tempfile.mkdtemp(prefix="agentloop-turn-ab-")
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", "--listen", f"127.0.0.1:{port}",
        "--data-dir", data_dir, "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        await server.stdout.readline()  # "agentloop listening on ..."
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            factory = fac_rpc.AgentFactoryServiceStub(channel)
            agents = api_rpc.AgentServiceStub(channel)
            request = fac.CreateAgentRequest(agent_id="ab", options=common.OPTIONS)
            await factory.CreateAgent(request)
            stream = agents.StreamSessionEvents(api.StreamSessionEventsRequest(agent_id="ab"))

            async def turn() -> None:
                await agents.SendMessage(api.SendMessageRequest(agent_id="ab", text="count me"))
                while True:
                    batch = await stream.read()
                    assert isinstance(batch, api.StreamSessionEventsResponse)
                    if any(event.HasField("turn_end") for event in batch.events):
                        return

            for _ in range(WARM):
                await turn()
            start, cpu = time.perf_counter(), common.cpu_seconds(server.pid)
            for _ in range(turns):
                await turn()
            per_turn = (time.perf_counter() - start) / turns * 1e6
            server_cpu = (common.cpu_seconds(server.pid) - cpu) / turns * 1e6
            stream.cancel()
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)
        shutil.rmtree(data_dir, ignore_errors=True)
    return per_turn, server_cpu


def worker(figure: str, turns: int) -> dict[str, float]:
    """One figure, in this process, over the checkout first on PYTHONPATH."""
    if figure == "memory":
        wall, cpu = asyncio.run(in_process("memory", turns))
        return {"memory_us": wall, "memory_cpu_us": cpu, "peak_rss_mb": common.peak_rss_mb()}
    if figure == "sqlite":
        wall, cpu = asyncio.run(in_process("sqlite", turns))
        return {"sqlite_us": wall, "sqlite_cpu_us": cpu}
    wall, cpu = asyncio.run(over_grpc(turns))
    return {"grpc_us": wall, "grpc_server_cpu_us": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3, help="processes per checkout")
    parser.add_argument("--against", nargs="*", default=[], help="other checkouts' directories")
    parser.add_argument("--worker", choices=("memory", "sqlite", "grpc"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.turns)))
        return
    trees = {"this": ""} | {tree: tree for tree in args.against}
    figures: dict[str, dict[str, float]] = {who: {} for who in trees}
    for part in ("memory", "sqlite", "grpc"):
        done = common.medians(__file__, trees, [part, "--turns", str(args.turns)], args.repeat)
        for who, values in done.items():
            figures[who].update(values)
    print(f"the benchmark turn, {args.turns} turns, median of {args.repeat} processes each")
    names = list(trees)
    print(f"  {'':<48}" + "".join(f"{name[-14:]:>16}" for name in names))
    for key, label in FIGURES.items():
        row = "".join(f"{figures[who][key]:>16,.1f}" for who in names)
        print(f"  {label:<48}{row}")
    if args.against:
        base = args.against[0]
        print(f"  ratios to {base}")
        for key, label in FIGURES.items():
            ratio = "".join(f"{figures[who][key] / figures[base][key]:>16.2f}" for who in names)
            print(f"  {label:<48}{ratio}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
