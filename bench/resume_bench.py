"""How long a resume of a long session holds the event loop, this checkout against another.

    python -m bench.resume_bench [--at 1000,3000] [--baseline DIR] [--repeat 1]

One in-process conversation of the benchmark workload (the scripted model, the SQLite
store in a temporary directory) grows to each turn of `--at`; there its agent is
disposed and resumed, `SAMPLES` times. A probe task beside the resume times (wall clock)
the longest time between two of its turns on the event loop: what every other agent,
stream and health check would wait at most. Printed (medians): the resume's wall time
and its longest stretch, and the longest stretch of the store's `load` of the session
alone (a part of the resume). The process collects garbage as the server does
(`server.memory.freeze_startup_heap`): a full collection may be the longest stretch.
With `--baseline`, checkout DIR runs the same in its own process (this file, on DIR's
server), `--repeat` rounds each, medians printed side by side. Figures are printed,
never asserted.

Runs as a script (`python bench/resume_bench.py --worker`), with a checkout first on
PYTHONPATH (`bench.common.worker`): that checkout's server and SDK, this `bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import checkouts, loop_probe, medians

SAMPLES = 3


async def stretch(work: Callable[[], Awaitable[Any]]) -> tuple[float, float, Any]:
    """(wall s, longest stretch s of the loop, result) of `work()`, a probe beside it."""
    running = asyncio.Event()
    running.set()
    probe = asyncio.create_task(loop_probe(running))
    await asyncio.sleep(0)  # the probe is waiting for its next turn
    start = time.perf_counter()
    result = await work()
    wall = time.perf_counter() - start
    running.clear()
    return wall, await probe, result


async def measure(at: list[int]) -> dict[str, float]:
    """The figures of the checkout this process imports."""
    from bench.common import OPTIONS, PROMPT
    from server.lifecycle.factory import AgentFactory

    try:
        from server.lifecycle.runtime import build_runtime
    except ImportError:  # a checkout from before the runtime moved to lifecycle
        from server.edge.app import build_runtime  # type: ignore[attr-defined]
    from server.settings.config import Config

    try:
        from server.memory import freeze_startup_heap
    except ImportError:  # a checkout that collects as CPython does
        pass
    else:
        freeze_startup_heap()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as data_dir:
        runtime = build_runtime(Config(store="sqlite", data_dir=data_dir))
        factory = AgentFactory(runtime)
        agent = await factory.create("long", OPTIONS)
        session_id = agent.session.session_id
        for turn in at:
            while agent.session.max_turn < turn:
                agent.send(PROMPT)
                await agent.when_idle()
            out[f"events@{turn}"] = len(agent.session)
            samples: dict[str, list[float]] = {"wall": [], "resume": [], "load": []}
            for _ in range(SAMPLES):
                await factory.dispose("long")
                _, longest, _ = await stretch(lambda: runtime.store.load(session_id))
                samples["load"].append(longest)
                wall, longest, agent = await stretch(
                    lambda: factory.resume("long", session_id, None)
                )
                samples["wall"].append(wall)
                samples["resume"].append(longest)
            for key, values in samples.items():
                out[f"{key}@{turn}"] = statistics.median(values) * 1e3
        await factory.close()
        await runtime.store.close()
    return out


def report(at: list[int], baseline: str, repeat: int) -> None:
    trees = checkouts(baseline)
    med = medians(__file__, trees, ["--at", ",".join(map(str, at))], repeat)
    against = f"; baseline {baseline}" if baseline else ""
    print(f"a resume of a long session (SQLite store): wall ms (median of {SAMPLES}, then of"
          f" {repeat} process(es)){against}")  # fmt: skip
    rows = (
        ("wall", "the resume: wall"),
        ("resume", "the resume: longest stretch"),
        ("load", "the store's load: longest stretch"),
    )
    heading = "".join(f"{who:>14}" for who in reversed(trees))
    print(f"  {'':<40}{heading}")
    for turn in at:
        print(f"  at turn {turn:,} ({med['this'][f'events@{turn}']:,.0f} events)")
        for key, label in rows:
            row = "".join(f"{med[who][f'{key}@{turn}']:>14,.1f}" for who in reversed(trees))
            print(f"    {label:<38}{row}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--at", default="1000,3000", help="comma-separated turn numbers")
    parser.add_argument("--baseline", default="", help="another checkout to compare with")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (each a fresh process)")
    parser.add_argument("--worker", action="store_true", help="one run; print JSON")
    args = parser.parse_args()
    at = [int(t) for t in args.at.split(",")]
    if args.worker:
        print(json.dumps(asyncio.run(measure(at))))
        return
    report(at, args.baseline, args.repeat)


if __name__ == "__main__":
    main()
