"""Run `python -m server` with a bench-only event-loop stall probe (and optionally cProfile).

    python -m bench.server_probe --lag-file PATH [--profile PATH] -- <server arguments>

The probe is a task on the server's own loop: it sleeps 5 ms at a time and records how
late each wake-up was, and how much CPU time the loop's thread spent meanwhile (a late
wake-up with little CPU spent is the machine's doing: another process had the core).
Every 0.25 s it appends a line to the lag file: the monotonic time, the worst lateness
since the last line, then per GC generation the collections so far and the longest
pause since the last line, then per generation the seconds spent collecting so far,
then the most thread CPU time between two wake-ups since the last line; a benchmark
takes the worst within its measuring window. The server itself is unchanged: this
wraps `server.edge.event_loop.run` (an older checkout's: `asyncio.run`) before calling
its entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib
import sys
import time
from collections.abc import Coroutine
from typing import Any

TICK = 0.005
REPORT = 0.25


class GcPauses:
    """The longest collection per generation (gc.callbacks), reported with the lag."""

    def __init__(self) -> None:
        self.started = 0.0
        self.worst = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self.total = [0.0, 0.0, 0.0]
        """Seconds spent in collections of each generation so far."""
        gc.callbacks.append(self.callback)

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        generation = info["generation"]
        took = time.perf_counter() - self.started
        self.count[generation] += 1
        self.total[generation] += took
        self.worst[generation] = max(self.worst[generation], took)


async def probe(path: str) -> None:
    pauses = GcPauses()
    with open(path, "a", buffering=1) as out:  # noqa: ASYNC230 - one line per 0.25 s
        worst = busy = 0.0
        reported = time.monotonic()
        while True:
            due, cpu = time.perf_counter() + TICK, time.thread_time()
            await asyncio.sleep(TICK)
            worst = max(worst, time.perf_counter() - due)
            busy = max(busy, time.thread_time() - cpu)
            now = time.monotonic()
            if now - reported >= REPORT:
                gcs = " ".join(
                    f"{n} {w:.5f}" for n, w in zip(pauses.count, pauses.worst, strict=True)
                )
                spent = " ".join(f"{t:.5f}" for t in pauses.total)
                out.write(f"{now:.3f} {worst:.5f} {gcs} {spent} {busy:.5f}\n")
                pauses.worst = [0.0, 0.0, 0.0]
                worst, busy, reported = 0.0, 0.0, now


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lag-file", required=True)
    parser.add_argument("--profile", default="")
    parser.add_argument("server_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()

    def with_probe(main: Coroutine[Any, Any, int]) -> Coroutine[Any, Any, int]:
        async def probed() -> int:
            task = asyncio.get_running_loop().create_task(probe(args.lag_file))
            try:
                return await main
            finally:
                task.cancel()

        return probed()

    try:
        event_loop: Any = importlib.import_module("server.edge.event_loop")
    except ImportError:  # an older checkout's server (`load_bench --tree`): asyncio.run
        run_asyncio = asyncio.run
        asyncio.run = lambda main, **kw: run_asyncio(with_probe(main), **kw)  # type: ignore[assignment]
    else:  # on the loop the server's config chooses
        run = event_loop.run
        event_loop.run = lambda main, choice: run(with_probe(main), choice)
    from server.__main__ import main as server_main

    argv = [a for a in args.server_args if a != "--"]
    if not args.profile:
        return server_main(argv)
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        return server_main(argv)
    finally:
        profiler.disable()
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    sys.exit(main())
