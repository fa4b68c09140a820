"""Instructions per turn, A/B: this tree against other checkouts, counted by valgrind.

    python -m bench.turn_instructions [--against DIR ...] [--turns 20,120]

What timings on a shared machine cannot give: the benchmark conversation (`turn_ab`'s
in-process workload: a tool call, the tool, a short text) on the memory store and on
SQLite, each checkout run under `valgrind --tool=cachegrind` for two turn counts; the
difference of the two counts over the difference of turns is one turn's instructions
(start-up, creation and warm-up cancel out). The hash seed is fixed and the fairness
slice is off, as the cost budget counts: the slice is wall time, and under valgrind
it fires every few chunks, which moved a tree's count by up to 4 % between runs (two
runs now agree within about 0.1 %). Counted: the process's user-space instructions,
every thread. Printed with each checkout's ratio to the first `--against`; nothing is
asserted. Needs valgrind; prints a note and stops without it.
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

STORES = ("memory", "sqlite")


def worker(store: str, turns: int) -> None:
    """Run the conversation over the checkout first on PYTHONPATH, fairness slice off."""
    from bench import turn_ab

    with contextlib.suppress(ImportError):  # an older tree has no fairness yields
        fairness: Any = importlib.import_module("server.kernel.fairness")
        fairness.SLICE = math.inf
    asyncio.run(turn_ab.in_process(store, turns))


def counted(tree: str, store: str, turns: int) -> int:
    """Instructions of one worker process of `turns` turns over checkout `tree`."""
    args = [str(Path(__file__).resolve()), "--worker", store, "--turns", str(turns)]
    return common.counted_run(args, tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", nargs="*", default=[], help="other checkouts' directories")
    parser.add_argument("--turns", default="20,120", help="the two turn counts, FEW,MANY")
    parser.add_argument("--worker", choices=STORES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, int(args.turns))
        return
    counts = common.counted_turns(args.turns)
    if counts is None:
        return
    few, many = counts
    trees = {"this": ""} | {tree: tree for tree in args.against}
    figures: dict[str, dict[str, float]] = {who: {} for who in trees}
    for store in STORES:
        for who, tree in trees.items():
            per_turn = (counted(tree, store, many) - counted(tree, store, few)) / (many - few)
            figures[who][store] = per_turn
    print(f"instructions per turn ({many} less {few} turns of one conversation, cachegrind)")
    names = list(trees)
    print(f"  {'':<28}" + "".join(f"{name[-14:]:>16}" for name in names))
    for store in STORES:
        row = "".join(f"{figures[who][store] / 1e6:>15.3f}M" for who in names)
        print(f"  {'in process, ' + store:<28}{row}")
    if args.against:
        base = args.against[0]
        print(f"  ratios to {base}")
        for store in STORES:
            row = "".join(f"{figures[who][store] / figures[base][store]:>16.3f}" for who in names)
            print(f"  {'in process, ' + store:<28}{row}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
