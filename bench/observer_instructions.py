"""The session-event observer counted in instructions (valgrind), against no observer.

    python -m bench.observer_instructions [--against DIR ...] [--turns 1,3] [--buffer N]

`plugin_bench --observer`'s workload (the server on the memory store in the counted
process, 10,000-chunk turns), the server process run under
`valgrind --tool=cachegrind --cache-sim=no` for two turn counts, with no plugin and
with one session-event observer of every event (`every_seam_plugin.py --observer-only`,
run natively, its buffer large enough that nothing drops): the difference of the two
counts over the difference of turns is one turn's instructions. The hash seed is fixed
and the fairness slice off (as `turn_instructions`). The observer's count still moves
a little with timing (how many notifications the writer gathers per message). Prints
each checkout's figures and ratio; nothing is asserted. Needs valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import math
from pathlib import Path
from typing import Any

from bench import common

HERE = Path(__file__).resolve()


async def worker(observed: bool, turns: int, buffer: int) -> None:
    """`turns` chunk turns over the checkout first on PYTHONPATH, with an observer or not."""
    from bench import plugin_bench as pb

    with contextlib.suppress(ImportError):  # an older tree has no fairness yields
        fairness: Any = importlib.import_module("server.kernel.fairness")
        fairness.SLICE = math.inf
    if not observed:
        await pb.chunk_turns_cpu(None, turns)
        return
    plugin, address = await pb.start(
        "every_seam_plugin.py", "--observer-only", "--buffer", str(buffer)
    )
    try:
        _, dropped = await pb.chunk_turns_cpu(address, turns)
        assert not dropped, "the observer's buffer overflowed: raise --buffer"
    finally:
        await pb.stop(plugin)


def counted(tree: str, observed: bool, turns: int, buffer: int) -> int:
    """Instructions of one worker process over checkout `tree`."""
    args = ["--worker", "--turns", str(turns), "--buffer", str(buffer)]
    return common.counted_run([str(HERE), *args, *(["--observed"] if observed else [])], tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", nargs="*", default=[], help="other checkouts' directories")
    parser.add_argument("--turns", default="1,3", help="the two turn counts, FEW,MANY")
    parser.add_argument("--buffer", type=int, default=100_000, help="the observer's buffer_size")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--observed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.observed, int(args.turns), args.buffer))
        return
    counts = common.counted_turns(args.turns)
    if counts is None:
        return
    few, many = counts
    trees = {"this": ""} | {tree: tree for tree in args.against}
    figures: dict[str, dict[str, float]] = {}
    for who, tree in trees.items():
        figures[who] = {}
        for side, observed in (("without", False), ("with", True)):
            difference = counted(tree, observed, many, args.buffer) - counted(
                tree, observed, few, args.buffer
            )
            figures[who][side] = difference / (many - few)
        figures[who]["ratio"] = figures[who]["with"] / figures[who]["without"]
    print(f"server instructions per 10,000-chunk turn ({many} less {few} turns, cachegrind)")
    print(f"  {'':<24}{'without':>12}{'with':>12}{'ratio':>8}")
    for who, row in figures.items():
        print(
            f"  {who[-24:]:<24}{row['without'] / 1e6:>11.1f}M{row['with'] / 1e6:>11.1f}M"
            f"{row['ratio']:>8.3f}"
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
