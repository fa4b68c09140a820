"""Instructions per turn, counted by valgrind: a figure the machine's other load leaves alone.

    python -m bench.instructions_bench [--agents 30] [--turns 2,8] [--baseline DIR]

On a shared machine the CPU time of a turn moves with the other processes (caches,
contention, preemption); the instructions a turn executes hardly do. A server of the
tree runs under `valgrind --tool=cachegrind --cache-sim=no` on its defaults (durable
store); N agents each loop the benchmark workload over their own stream for a few
turns, then, in a second server, for more: the difference of the two instruction
counts over the difference of turns is the server's instructions per turn at N agents
(start-up and agent creation cancel out). The same for the in-process turn (50 agents,
a turn each per round), on the memory store and on SQLite (the server's default).
Counted: the user-space instructions of all the process's threads; the kernel's work
(syscalls: socket writes, SQLite's file writes) is not. The split of two runs depends
a little on timing, so a figure moves by a few percent between runs. Needs valgrind;
prints a note and stops without it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agentloop.client import connect
from bench.common import OPTIONS, free_port, instructions, one_turn

ROOT = str(Path(__file__).resolve().parent.parent)
CACHEGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no"]
IN_PROCESS_AGENTS = 50


async def server_run(tree: str, agents: int, turns: int, out: str) -> int:
    """Instructions of a server whose `agents` agents each run `turns` turns."""
    data_dir = tempfile.mkdtemp(prefix="agentloop-instructions-")
    config = Path(data_dir) / "config.yaml"
    config.write_text("agents: []\n")
    address = f"127.0.0.1:{free_port()}"
    server = await asyncio.create_subprocess_exec(
        *CACHEGRIND, f"--cachegrind-out-file={out}", sys.executable, "-m", "server",
        "--config", str(config), "--listen", address, "--data-dir", data_dir,
        "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=tree), cwd=tree,
    )  # fmt: skip
    assert server.stdout is not None
    try:
        await server.stdout.readline()  # "agentloop listening on ..."
        client = connect(address)
        ids = [f"agent-{i}" for i in range(agents)]
        for start in range(0, agents, 50):
            await asyncio.gather(*(client.create(a, OPTIONS) for a in ids[start : start + 50]))

        async def drive(agent_id: str) -> None:
            async with client.conversation(agent_id) as chat:
                for _ in range(turns):
                    await (await chat.send("count these words")).result()

        await asyncio.gather(*(drive(a) for a in ids))
        await client.close()
    finally:
        server.terminate()
        await server.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
    return instructions(out)


async def in_process_turns(rounds: int, store: str) -> None:
    """The child of `in_process_run`: `rounds` turns of each of 50 agents on `store`."""
    from server.lifecycle.factory import AgentFactory

    try:
        from server.lifecycle.runtime import build_runtime
    except ImportError:  # a checkout from before the runtime moved to lifecycle
        from server.edge.app import build_runtime  # type: ignore[attr-defined]
    from server.settings.config import Config

    with tempfile.TemporaryDirectory() as data_dir:
        runtime = build_runtime(Config(store=store, data_dir=data_dir))
        factory = AgentFactory(runtime)
        agents = [await factory.create(f"a-{i}", OPTIONS) for i in range(IN_PROCESS_AGENTS)]
        for _ in range(rounds):
            for agent in agents:
                await one_turn(agent)
        await factory.close()
        await runtime.store.close()


def in_process_run(tree: str, rounds: int, out: str, store: str) -> int:
    # This file runs the turns, on `tree`'s server (a baseline may predate this file).
    command = [*CACHEGRIND, f"--cachegrind-out-file={out}", sys.executable, __file__]
    command += ["--in-process-rounds", str(rounds), "--in-process-store", store]
    env = dict(os.environ, PYTHONPATH=tree)
    subprocess.run(command, env=env, cwd=tree, check=True, stderr=subprocess.DEVNULL)
    return instructions(out)


async def per_turn(
    tree: str, agents: int, low: int, high: int, work: str
) -> tuple[float, float, float]:
    """(server, in-process memory store, in-process SQLite) instructions per turn of `tree`."""
    few = await server_run(tree, agents, low, f"{work}/server-{low}.out")
    more = await server_run(tree, agents, high, f"{work}/server-{high}.out")
    server = (more - few) / (agents * (high - low))
    local = []
    for store in ("memory", "sqlite"):
        few = in_process_run(tree, low, f"{work}/{store}-{low}.out", store)
        more = in_process_run(tree, high, f"{work}/{store}-{high}.out", store)
        local.append((more - few) / (IN_PROCESS_AGENTS * (high - low)))
    return server, local[0], local[1]


async def bench(agents: int, low: int, high: int, baseline: str) -> None:
    trees = {"this": ROOT} | ({"baseline": baseline} if baseline else {})
    print(f"instructions per turn (cachegrind) · {agents} agents over gRPC, turns {low} → {high}")
    figures = {}
    for name, tree in trees.items():
        with tempfile.TemporaryDirectory() as work:
            figures[name] = server, memory, sqlite = await per_turn(tree, agents, low, high, work)
        print(f"  {name:<9} server {server:>12,.0f}   in process: memory store {memory:>12,.0f},"
              f" SQLite {sqlite:>12,.0f}   ({tree})")  # fmt: skip
        print(f"  {'':<9} server / in process: memory store {server / memory:.2f}×"
              f" (target ≤ 2× at 100 agents), SQLite store {server / sqlite:.2f}×")  # fmt: skip
    if baseline:
        ratio = figures["this"][0] / figures["baseline"][0]
        print(f"  server instructions per turn, this / baseline: {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", type=int, default=30)
    parser.add_argument("--turns", default="2,8", help="turns per agent of the two runs")
    parser.add_argument("--baseline", default="", help="another checkout to count as well")
    parser.add_argument("--in-process-rounds", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--in-process-store", default="memory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process_rounds:
        asyncio.run(in_process_turns(args.in_process_rounds, args.in_process_store))
        return
    if shutil.which("valgrind") is None:
        print("instructions_bench: valgrind is not installed (apt-get install valgrind)")
        return
    low, high = (int(n) for n in args.turns.split(","))
    asyncio.run(bench(args.agents, low, high, args.baseline))


if __name__ == "__main__":
    main()
