"""What the SQLite store writes per in-process turn: commits, rows, WAL pages, WAL size.

    python -m bench.store_pages_bench [--agents 200] [--rounds 3] [--tree DIR]

N agents each run the benchmark workload (loop_bench's) for a few rounds, one turn at
a time, on the SQLite store. Counted twice. First with checkpoints off, so the WAL
only grows: its growth over the turns, in frames (a page and its header), is the
pages the turns' commits wrote. Then on the store's own checkpoint policy: the WAL's
size at the end, before the store is closed (a clean close folds it in). `--tree` runs
another checkout's store (a baseline). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import checkout_env

FRAME = 4096 + 24
"""A WAL frame of a 4 KiB page: the page and its 24-byte header."""


def size(path: Path) -> int:
    """A file's size in bytes (a stat: too quick to take off the loop)."""
    return path.stat().st_size


async def turns(agents: int, rounds: int, checkpoints: bool) -> dict[str, float]:
    from bench.common import OPTIONS, one_turn
    from server.lifecycle.factory import AgentFactory

    try:
        from server.lifecycle.runtime import build_runtime
    except ImportError:  # a checkout from before the runtime moved to lifecycle
        from server.edge.app import build_runtime  # type: ignore[attr-defined]
    from server.settings.config import Config
    from server.stores import sqlite as sqlite_store

    if not checkpoints:  # the policy's constants, as this tree or an older one names them
        for name in ("CHECKPOINT_PAGES", "CHECKPOINT_BYTES"):
            if hasattr(sqlite_store, name):
                setattr(sqlite_store, name, 1 << 60)
    with tempfile.TemporaryDirectory() as data_dir:
        db = Path(data_dir) / "agentloop.db"
        wal = Path(f"{db}-wal")
        runtime = build_runtime(Config(store="sqlite", data_dir=data_dir))
        factory = AgentFactory(runtime)
        started = [await factory.create(f"agent-{i}", OPTIONS) for i in range(agents)]
        commits, frames = runtime.journal.commits, size(wal) // FRAME
        for _ in range(rounds):
            for agent in started:
                await one_turn(agent)
        count = agents * rounds
        out = {
            "commits": (runtime.journal.commits - commits) / count,
            "pages": (size(wal) // FRAME - frames) / count,
            "wal_mb": size(wal) / 1e6,
        }
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(events)")}
            rows, events = conn.execute(
                "SELECT COUNT(*), " + ("SUM(count)" if "count" in columns else "COUNT(*)")
                + " FROM events"
            ).fetchone()  # fmt: skip
        out["rows_per_event"] = rows / events
        await factory.close()
        await runtime.store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", default="", help="count another checkout's store")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        figures = asyncio.run(turns(args.agents, args.rounds, args.child == "on"))
        print(" ".join(f"{k}={v}" for k, v in figures.items()))
        return
    tree = args.tree or str(Path(__file__).resolve().parent.parent)
    print(f"SQLite store per in-process turn · {args.agents} agents × {args.rounds} turns · {tree}")
    for checkpoints in ("off", "on"):
        command = [sys.executable, __file__, "--child", checkpoints]  # on `tree`'s server
        command += ["--agents", str(args.agents), "--rounds", str(args.rounds)]
        env = checkout_env(args.tree)
        done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr)
            return
        line = done.stdout.strip().splitlines()[-1]
        figures = {k: float(v) for k, v in (part.split("=") for part in line.split())}
        if checkpoints == "off":
            print(f"  commits per turn                         {figures['commits']:8.2f}")
            print(f"  event rows per event                     {figures['rows_per_event']:8.2f}")
            print(f"  WAL pages written per turn               {figures['pages']:8.2f}")
        else:
            print(f"  WAL size at the end (own checkpoints)    {figures['wal_mb']:8.1f} MB")


if __name__ == "__main__":
    main()
