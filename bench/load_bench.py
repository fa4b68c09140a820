"""Many agents at once over gRPC: throughput, server CPU per turn, tail latency, stalls.

    python -m bench.load_bench [--agents 1,10,100,1000] [--seconds S] [--profile DIR]

For each N a fresh server process runs on its defaults (durable SQLite in a temporary
directory). N clients (one process, one channel) each create an agent, follow its
session on one stream (the SDK's `Client.conversation`) and loop the benchmark
workload: send a message, then read the turn that answers it to its `turn_end`. After
a warm-up, a window of S seconds is measured: turns completed, the server's CPU time
from /proc (µs per turn), SendMessage → turn_end p50/p99/max, the longest event-loop
stall measured inside the server (bench/server_probe.py), and the server's RSS. The
in-process turn (memory store and SQLite; wall and CPU time; measured in this run
before and after each load, median) is the reference of the ratios: server CPU against
in-process CPU, latency against wall time. One agent's turns are turns of one long
conversation: their like-for-like reference is one in-process conversation as long, on
SQLite, over the same turns (p50 against p50). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentloop.client import Client, connect
from bench.common import (
    OPTIONS,
    cpu_seconds,
    free_port,
    kernel_seconds,
    line,
    main_thread_seconds,
    one_turn,
    rss_mb,
)
from bench.conversation_bench import span_in_tree
from server.lifecycle.factory import AgentFactory
from server.lifecycle.runtime import build_runtime
from server.settings.config import Config

ROOT = str(Path(__file__).resolve().parent.parent)
PROBE = str(Path(__file__).with_name("server_probe.py"))


TEXT = "count these words"
"""Each turn's message."""


class Driver:
    """One agent, one event stream, the workload in a loop."""

    def __init__(self, client: Client, agent_id: str) -> None:
        self.client = client
        self.agent_id = agent_id
        self.done: list[tuple[float, float]] = []  # (sent, ended) in perf_counter time
        self.responses = 0  # stream responses read

    async def create(self) -> None:
        await self.client.create(self.agent_id, OPTIONS)

    async def run(self, until: float) -> None:
        async with self.client.conversation(self.agent_id) as chat:
            while time.perf_counter() < until:
                sent = time.perf_counter()
                batches = chat.stream.batches_read
                await (await chat.send(TEXT)).result()
                self.responses += chat.stream.batches_read - batches
                self.done.append((sent, time.perf_counter()))


async def start_server(
    data_dir: str, profile: str, tree: str, loop: str = ""
) -> tuple[asyncio.subprocess.Process, str, Path]:
    address = f"127.0.0.1:{free_port()}"
    lag_file = Path(data_dir) / "lag.txt"
    config = Path(data_dir) / "config.yaml"
    # The defaults without the sample agent (maxAgents); `loop`: another event loop.
    config.write_text("agents: []\n" + (f"eventLoop: {loop}\n" if loop else ""))
    extra = ["--profile", profile] if profile else []
    tree = tree or ROOT  # or another checkout's server
    env = dict(os.environ, PYTHONPATH=tree)
    server = await asyncio.create_subprocess_exec(
        sys.executable, PROBE, "--lag-file", str(lag_file), *extra, "--",
        "--config", str(config), "--listen", address, "--data-dir", data_dir,
        "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE, env=env, cwd=tree,
    )  # fmt: skip
    assert server.stdout is not None
    await server.stdout.readline()  # "agentloop listening on ..."
    return server, address, lag_file


def worst_stall(lag_file: Path, start: float, end: float) -> dict[str, float]:
    """In the window: the longest loop stall, the most loop-thread CPU between two ticks, the
    longest GC pause, and per generation the collections made and the seconds spent in them."""
    worst = busy = pause = 0.0
    rows = []
    for row in lag_file.read_text().splitlines():
        at, lag, *gcs = map(float, row.split())
        if start <= at <= end + 0.3:
            worst, busy = max(worst, lag), max(busy, gcs[9])
            pause = max(pause, *gcs[1:6:2])
            rows.append(gcs)
    out = {"stall": worst, "stall_cpu": busy, "gc_pause": pause}
    for generation in range(3):
        first, last = (rows[0], rows[-1]) if rows else ([0.0] * 9, [0.0] * 9)
        out[f"gc{generation}"] = last[2 * generation] - first[2 * generation]
        out[f"gc{generation}_s"] = last[6 + generation] - first[6 + generation]
    return out


async def sample_wal(data_dir: str, into: list[float]) -> None:
    """The server's SQLite WAL size in MB every 0.1 s (a stat: quick enough for this loop)."""
    while True:
        try:
            into.append(os.stat(f"{data_dir}/agentloop.db-wal").st_size / 1e6)
        except OSError:
            into.append(0.0)
        await asyncio.sleep(0.1)


async def load(
    agents: int,
    seconds: float,
    warmup: float,
    profile: str = "",
    tree: str = "",
    loop: str = "",
) -> dict[str, float]:
    data_dir = tempfile.mkdtemp(prefix="agentloop-load-")
    server, address, lag_file = await start_server(data_dir, profile, tree, loop)
    try:
        client = connect(address)
        try:
            drivers = [Driver(client, f"load-{i}") for i in range(agents)]
            for chunk in range(0, agents, 100):
                await asyncio.gather(*(d.create() for d in drivers[chunk : chunk + 100]))
            began = time.perf_counter()
            until = began + warmup + seconds
            tasks = [asyncio.ensure_future(d.run(until)) for d in drivers]
            wal: list[float] = []  # from the start of the warm-up to the window's end
            sampler = asyncio.ensure_future(sample_wal(data_dir, wal))
            await asyncio.sleep(warmup)
            window_start, mono_start = time.perf_counter(), time.monotonic()
            responses = sum(d.responses for d in drivers)
            cpu_before, main_before = cpu_seconds(server.pid), main_thread_seconds(server.pid)
            kernel_before = kernel_seconds(server.pid)
            await asyncio.sleep(seconds)
            cpu = cpu_seconds(server.pid) - cpu_before
            main = main_thread_seconds(server.pid) - main_before
            kernel = kernel_seconds(server.pid) - kernel_before
            window_end, mono_end = time.perf_counter(), time.monotonic()
            sampler.cancel()
            rss = rss_mb(server.pid)
            responses = sum(d.responses for d in drivers) - responses
            await asyncio.gather(*tasks)
        finally:
            await client.close()
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 60)
    gcs = worst_stall(lag_file, mono_start, mono_end)
    shutil.rmtree(data_dir, ignore_errors=True)
    ended = [(s, e) for d in drivers for s, e in d.done if window_start <= e <= window_end]
    latencies = sorted(e - s for s, e in ended) or [0.0]  # turns that ended in the window
    first = drivers[0].done  # one conversation: which of its turns the window measured
    window = [i for i, (_, e) in enumerate(first) if window_start <= e <= window_end] or [0]
    turns = max(1, len(ended))
    elapsed = window_end - window_start
    return {
        "turns": len(ended),
        "turns_per_s": len(ended) / elapsed,
        "cpu_us": cpu / turns * 1e6,
        "loop_share": main / cpu if cpu else 0.0,
        "kernel_share": kernel / cpu if cpu else 0.0,
        "responses": responses / turns,
        "wal_end": wal[-1] if wal else 0.0,
        "wal_max": max(wal, default=0.0),
        "p50": statistics.median(latencies),
        "p99": latencies[int(0.99 * (len(latencies) - 1))],
        "max": latencies[-1],
        "rss": rss,
        **gcs,
        "gc_us": sum(gcs[f"gc{g}_s"] for g in range(3)) / turns * 1e6,
        "first_turn": window[0],
        "last_turn": window[-1],
    }


IN_PROCESS_BLOCK = 25
"""Turns per timed block of the in-process reference: the median block is the figure, so
a burst of another process's load spoils a block, not the reference."""


async def in_process_turn(store: str, turns: int) -> tuple[float, float]:
    """(wall µs, CPU µs) per independent in-process turn on `store` (as loop_bench's)."""
    with tempfile.TemporaryDirectory() as data_dir:
        runtime = build_runtime(Config(store=store, data_dir=data_dir))
        factory = AgentFactory(runtime)
        warm = await factory.create("warm", OPTIONS)
        for _ in range(20):
            await one_turn(warm)
        agents = [await factory.create(f"{store}-{i}", OPTIONS) for i in range(turns)]
        gc.collect()
        walls, cpus = [], []
        for start in range(0, turns, IN_PROCESS_BLOCK):
            block = agents[start : start + IN_PROCESS_BLOCK]
            wall, cpu = time.perf_counter(), time.process_time()
            for agent in block:
                await one_turn(agent)
            walls.append((time.perf_counter() - wall) / len(block))
            cpus.append((time.process_time() - cpu) / len(block))
        await factory.close()
        await runtime.store.close()
    return statistics.median(walls) * 1e6, statistics.median(cpus) * 1e6


async def in_process(turns: int) -> dict[str, float]:
    """The in-process references: memory and SQLite stores, wall time and CPU time."""
    memory_wall, memory_cpu = await in_process_turn("memory", turns)
    sqlite_wall, sqlite_cpu = await in_process_turn("sqlite", turns)
    return {
        "memory_wall": memory_wall,
        "memory_cpu": memory_cpu,
        "sqlite_wall": sqlite_wall,
        "sqlite_cpu": sqlite_cpu,
    }


async def bench(counts: list[int], seconds: float, profile_dir: str, tree: str = "") -> None:
    print(f"load benchmark · Python {sys.version.split()[0]} · {os.cpu_count()} cores"
          f" · server of {tree or ROOT}")  # fmt: skip
    refs = [await in_process(300)]
    results = {}
    conversation = {"wall_p50": 0.0, "cpu": 0.0}
    for n in counts:
        window = seconds if n < 1000 else max(seconds / 2, 5.0)
        profile = f"{profile_dir}/server-{n}.prof" if profile_dir else ""
        warmup = 2.0 if n < 1000 else 5.0
        results[n] = await load(n, window, warmup, profile=profile, tree=tree)
        if n == 1:  # its like-for-like reference: one conversation as long, its loop
            first, last = int(results[1]["first_turn"]), int(results[1]["last_turn"])
            conversation = span_in_tree(tree, TEXT, first, last)
        refs.append(await in_process(300))  # interleaved: the machine may be shared
    ref = {k: statistics.median(r[k] for r in refs) for k in refs[0]}
    print(f"in process, independent turns (median of {len(refs)}, one before and one after"
          " each load)")  # fmt: skip
    line("memory store: wall / CPU", f"{ref['memory_wall']:,.0f} / {ref['memory_cpu']:,.0f} µs",
         "")  # fmt: skip
    line("SQLite store (the server's default): wall / CPU",
         f"{ref['sqlite_wall']:,.0f} / {ref['sqlite_cpu']:,.0f} µs", "")  # fmt: skip
    if 1 in results:
        first, last = int(results[1]["first_turn"]) + 1, int(results[1]["last_turn"]) + 1
        print(f"in process, one conversation of {last:,} turns (SQLite store), turns {first:,} to"
              f" {last:,}: the 1-agent run's measured turns")  # fmt: skip
        line("wall p50 / CPU per turn",
             f"{conversation['wall_p50']:,.0f} / {conversation['cpu']:,.0f} µs", "")  # fmt: skip
    for n, r in results.items():
        print(f"{n} agent(s) over gRPC, each with its own event stream (server on its defaults)")
        line("turns completed in the window", f"{r['turns']:,.0f}", "")
        line("stream responses per turn", f"{r['responses']:.1f}", "")
        line("turns per second", f"{r['turns_per_s']:,.0f}", "")
        line("server CPU per turn", f"{r['cpu_us']:,.0f} µs", "")
        line("  share of the event-loop thread", f"{r['loop_share']:.0%}", "")
        line("  share in the kernel (syscalls)", f"{r['kernel_share']:.0%}", "")
        to_memory, to_sqlite = r["cpu_us"] / ref["memory_cpu"], r["cpu_us"] / ref["sqlite_cpu"]
        line("  / in-process CPU per turn (memory store)", f"{to_memory:.2f}×",
             "≤ 2× at 100 agents" if n == 100 else "")  # fmt: skip
        line("  / in-process CPU per turn (SQLite store)", f"{to_sqlite:.2f}×", "")
        if n == 1:
            line("  / in-process CPU (same conversation, SQLite)",
                 f"{r['cpu_us'] / conversation['cpu']:.2f}×", "")  # fmt: skip
        line("SendMessage → turn_end p50", f"{r['p50'] * 1e3:,.2f} ms", "")
        if n == 1:
            line("  p50 / in-process turn (memory store, wall)",
                 f"{r['p50'] * 1e6 / ref['memory_wall']:.2f}×", "≤ 3×")  # fmt: skip
            line("  p50 / in-process turn (SQLite store, wall)",
                 f"{r['p50'] * 1e6 / ref['sqlite_wall']:.2f}×", "")  # fmt: skip
            line("  p50 / in-process p50 (same conversation, SQLite)",
                 f"{r['p50'] * 1e6 / conversation['wall_p50']:.2f}×", "≤ 3×")  # fmt: skip
        line("SendMessage → turn_end p99", f"{r['p99'] * 1e3:,.2f} ms", "")
        line("  p99 / p50", f"{r['p99'] / r['p50']:.2f}×" if r["p50"] else "-", "≤ 5×")
        line("SendMessage → turn_end max", f"{r['max'] * 1e3:,.2f} ms", "")
        line("longest event-loop stall in the server", f"{r['stall'] * 1e3:,.1f} ms", "≤ 50 ms")
        line("  loop-thread CPU between two ticks, at most", f"{r['stall_cpu'] * 1e3:,.1f} ms", "")
        line("  longest GC pause in it", f"{r['gc_pause'] * 1e3:,.1f} ms", "")
        turns = max(1.0, r["turns"])
        line("  collections per turn: young / middle", f"{r['gc0'] / turns:.2f} /"
             f" {r['gc1'] / turns:.3f}", "")  # fmt: skip
        line("  full collections in the window", f"{r['gc2']:,.0f}", "")
        line("  GC time per turn", f"{r['gc_us']:,.0f} µs"
             f" ({r['gc_us'] / r['cpu_us']:.1%} of the CPU)", "")  # fmt: skip
        line("server RSS", f"{r['rss']:,.0f} MB", "")
        wal = f"{r['wal_end']:,.1f} / {r['wal_max']:,.1f} MB"
        line("SQLite WAL at the end / at most", wal, "")


async def compare(counts: list[int], seconds: float, baseline: str, repeat: int) -> None:
    """This checkout's server against `baseline`'s, interleaved, medians of `repeat` rounds.

    `baseline` "asyncio" compares this checkout on asyncio's loop (`eventLoop: asyncio`)
    against it on its default loop (uvloop). One agent's rounds add `p50/conv`: its p50
    against the in-process p50 of one conversation as long on SQLite, each tree's own
    loop (run after each load, in a fresh process).
    """
    print(f"load A/B · baseline {baseline} · {repeat} interleaved rounds · medians")
    on_asyncio = baseline == "asyncio"
    baseline = "" if on_asyncio else baseline
    keys: tuple[str, ...] = ("turns_per_s", "cpu_us", "p50", "p99", "max", "stall", "stall_cpu")
    keys += ("gc_us", "rss", "wal_max")  # wal_max: the SQLite WAL at most, MB
    for n in counts:
        runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
        for _ in range(repeat):
            for who, tree in (("baseline", baseline), ("this", "")):
                loop = "asyncio" if on_asyncio and who == "baseline" else ""
                r = await load(n, seconds, 2.0, tree=tree, loop=loop)
                if n == 1:
                    first, last = int(r["first_turn"]), int(r["last_turn"])
                    conversation = span_in_tree(tree, TEXT, first, last)
                    r["p50/conv"] = r["p50"] * 1e6 / conversation["wall_p50"]
                runs[who].append(r)
        columns: tuple[str, ...] = (*keys, "p50/conv") if n == 1 else keys
        print(f"{n} agent(s)        " + "".join(f"{k:>12}" for k in columns))
        med = {
            who: {k: statistics.median(r[k] for r in rs) for k in columns}
            for who, rs in runs.items()
        }
        for who, m in med.items():
            print(f"  {who:<16}" + "".join(f"{m[k]:>12.4g}" for k in columns))
        ratios = [
            statistics.median(b[k] and t[k] / b[k] for b, t in zip(*runs.values(), strict=True))
            for k in columns
        ]
        print(f"  {'this / baseline':<16}" + "".join(f"{r:>12.2f}" for r in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", default="1,10,100,1000", help="comma-separated counts")
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring window per count")
    parser.add_argument("--profile", default="", help="directory for a cProfile of each server")
    parser.add_argument(
        "--baseline",
        default="",
        help="another checkout: A/B against its server ('asyncio': this one on asyncio's loop)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds of the A/B")
    parser.add_argument("--tree", default="", help="run the server of another checkout")
    args = parser.parse_args()
    counts = [int(n) for n in args.agents.split(",")]
    if args.baseline:
        asyncio.run(compare(counts, args.seconds, args.baseline, args.repeat))
    else:
        asyncio.run(bench(counts, args.seconds, args.profile, args.tree))


if __name__ == "__main__":
    main()
