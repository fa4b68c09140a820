"""How long the SQLite store's reads wait while a WAL checkpoint runs.

    python -m bench.checkpoint_reads_bench [--sessions 200] [--seconds 10] [--tree DIR]
        [--baseline DIR --repeat 2]

In one process, on a real SQLite file in a temporary directory: writer tasks commit
turns (ten events each, a few sessions per commit, as the journal groups them) at a
steady pace, so the store's own background checkpoints come every few hundred milliseconds;
a reader task reads the last events of a random session (a `StreamEvents` catch-up),
one small read every 2 ms. Each read's latency is noted with whether a
checkpoint ran while it waited. Printed: read latency p50/p99/max of all reads and of
those that overlapped a checkpoint, commit latency, checkpoints and full folds, the
longest last pass (commits held), and the WAL's largest size. `--tree` runs another
checkout's store; `--baseline` runs both, interleaved, `--repeat` times. Figures are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)
SESSIONS_PER_COMMIT = 4
WRITERS = 16
PACE = 0.01
"""Each writer's pause between its commits (a loop that is busy, not saturated)."""


def size(path: Path) -> int:
    """A file's size in bytes (a stat: too quick to take off the loop)."""
    return path.stat().st_size


def pct(values: list[float], q: float) -> float:
    """The q-quantile of `values` (0 if empty), nearest rank."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(sessions: int, seconds: float) -> dict[str, float]:
    from agentloop.v1 import session_event_pb2 as ev
    from agentloop.v1 import session_pb2
    from server.sessions.session import SessionLog
    from server.stores import Commit, SessionWrites
    from server.stores.sqlite import SqliteStore

    with tempfile.TemporaryDirectory() as data_dir:
        db = Path(data_dir) / "agentloop.db"
        wal_file = Path(f"{db}-wal")
        store = SqliteStore(db)
        ids = [f"session-{i}" for i in range(sessions)]
        logs = {i: SessionLog(i, session_pb2.SessionHeader()) for i in ids}
        for session_id in ids:
            await store.commit(Commit({session_id: SessionWrites(create=logs[session_id].header)}))
        turns = dict.fromkeys(ids, 0)
        free = list(ids)  # sessions no writer is committing right now
        random.seed(7)
        reads: list[tuple[float, bool]] = []
        commits: list[float] = []
        wal_max = 0
        timed: set[asyncio.Future[None]] = set()
        durations: list[float] = []

        def checkpoint_took(began: float) -> Callable[[asyncio.Future[None]], None]:
            return lambda _: durations.append(time.perf_counter() - began)

        until = time.perf_counter() + seconds

        def turn(session_id: str) -> list[ev.SessionEvent]:
            log = logs[session_id]
            turns[session_id] += 1
            n, start = turns[session_id], len(log.events)
            log.add(ev.TurnStart(turn=n, trigger=ev.TRIGGER_KIND_MESSAGE))
            for _ in range(8):
                log.add(ev.AssistantChunk(turn=n, step=1))
            log.add(ev.TurnEnd(turn=n))
            return log.events[start:]

        async def writer() -> None:
            nonlocal wal_max
            while time.perf_counter() < until:
                random.shuffle(free)
                mine = [free.pop() for _ in range(min(SESSIONS_PER_COMMIT, len(free)))]
                commit = Commit({s: SessionWrites(events=turn(s)) for s in mine})
                began = time.perf_counter()
                await store.commit(commit)
                commits.append(time.perf_counter() - began)
                free.extend(mine)
                wal_max = max(wal_max, size(wal_file))
                running = store.wal.running
                if running is not None and running not in timed:
                    timed.add(running)
                    running.add_done_callback(checkpoint_took(time.perf_counter()))
                await asyncio.sleep(PACE)

        async def reader() -> None:
            wal = store.wal
            while time.perf_counter() < until:
                session_id = random.choice(ids)
                count = len(logs[session_id].events)
                checkpoints = wal.stats.checkpoints
                during = wal.busy()
                began = time.perf_counter()
                await store.read(session_id, max(1, count - 10), count + 1)
                took = time.perf_counter() - began
                during = during or wal.busy() or wal.stats.checkpoints != checkpoints
                reads.append((took, during))
                await asyncio.sleep(0.002)

        try:
            await asyncio.gather(reader(), *(writer() for _ in range(WRITERS)))
            stats = store.wal.stats
            await store.wal.done()
        finally:
            await store.close()
    during = [t for t, d in reads if d]
    all_reads = [t for t, _ in reads]
    return {
        "reads": len(all_reads),
        "read_p50_ms": 1e3 * pct(all_reads, 0.5),
        "read_p99_ms": 1e3 * pct(all_reads, 0.99),
        "read_max_ms": 1e3 * max(all_reads, default=0.0),
        "reads_during": len(during),
        "during_p50_ms": 1e3 * pct(during, 0.5),
        "during_p99_ms": 1e3 * pct(during, 0.99),
        "during_max_ms": 1e3 * max(during, default=0.0),
        "commits_per_s": len(commits) / seconds,
        "commit_p50_ms": 1e3 * pct(commits, 0.5),
        "commit_p99_ms": 1e3 * pct(commits, 0.99),
        "commit_max_ms": 1e3 * max(commits, default=0.0),
        "checkpoints": stats.checkpoints,
        "folds": stats.folds,
        "checkpoint_p50_ms": 1e3 * pct(durations, 0.5),
        "checkpoint_max_ms": 1e3 * max(durations, default=0.0),
        "hold_max_ms": 1e3 * stats.longest_hold,
        "cap_waits": stats.waits,
        "wal_max_mb": wal_max / 1e6,
    }


def child(tree: str, sessions: int, seconds: float) -> dict[str, float]:
    """One run in its own process on `tree`'s store."""
    command = [sys.executable, __file__, "--child"]
    command += ["--sessions", str(sessions), "--seconds", str(seconds)]
    # This script, on the other tree's server code (first on the path).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, ROOT]))
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    line = done.stdout.strip().splitlines()[-1]
    return {k: float(v) for k, v in (part.split("=") for part in line.split())}


ROWS = [
    ("reads (all)", "reads", "{:.0f}"),
    ("  read p50 / p99 / max ms", ("read_p50_ms", "read_p99_ms", "read_max_ms"), "{:.2f}"),
    ("reads during a checkpoint", "reads_during", "{:.0f}"),
    ("  read p50 / p99 / max ms", ("during_p50_ms", "during_p99_ms", "during_max_ms"), "{:.2f}"),
    ("commits per second", "commits_per_s", "{:.0f}"),
    ("  commit p50 / p99 / max ms", ("commit_p50_ms", "commit_p99_ms", "commit_max_ms"), "{:.2f}"),
    ("checkpoints / full folds", ("checkpoints", "folds"), "{:.0f}"),
    ("checkpoint p50 / max ms", ("checkpoint_p50_ms", "checkpoint_max_ms"), "{:.1f}"),
    ("longest last pass (commits held) ms", "hold_max_ms", "{:.1f}"),
    ("commits that waited at the WAL's cap", "cap_waits", "{:.0f}"),
    ("WAL at most MB", "wal_max_mb", "{:.1f}"),
]


def show(label: str, figures: dict[str, float]) -> None:
    print(f"  {label}")
    for name, keys, fmt in ROWS:
        names = keys if isinstance(keys, tuple) else (keys,)
        values = " / ".join(fmt.format(figures.get(k, float("nan"))) for k in names)
        print(f"    {name:<38} {values}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tree", default="", help="run another checkout's store")
    parser.add_argument("--baseline", default="", help="A/B against another checkout")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved rounds of the A/B")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        figures = asyncio.run(run(args.sessions, args.seconds))
        print(" ".join(f"{k}={v}" for k, v in figures.items()))
        return
    print(
        f"SQLite reads during checkpoints · {args.sessions} sessions · {WRITERS} writers"
        f" · {args.seconds:g} s"
    )
    if not args.baseline:
        tree = args.tree or ROOT
        show(tree, child(tree, args.sessions, args.seconds))
        return
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
    for _ in range(args.repeat):
        for who, tree in (("baseline", args.baseline), ("this", ROOT)):
            figures = child(tree, args.sessions, args.seconds)
            runs[who].append(figures)
            show(f"{who} ({tree})", figures)
    print(f"medians of {args.repeat} runs")
    for who, figures_list in runs.items():
        keys = figures_list[0].keys()
        show(who, {k: statistics.median(f[k] for f in figures_list) for k in keys})


if __name__ == "__main__":
    main()
