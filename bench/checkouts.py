"""A bench's figures from several checkouts: its `--worker` run over each, medians taken.

A worker is the bench script itself, run in a fresh process with one checkout first on
PYTHONPATH (so that it imports only that checkout's modules); it prints its figures as
one JSON object on its last line. The parent side imports this module where it needs
it, never at the top of a bench: a worker may run over a checkout without it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(script: str, tree: str, args: list[str]) -> dict[str, float]:
    """The figures of one `script --worker ARGS` run over checkout `tree` (this one if "")."""
    root = Path(tree) if tree else ROOT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "clients/python")]))
    done = subprocess.run(
        [sys.executable, str(Path(script).resolve()), "--worker", *args],
        env=env, cwd=root, check=True, capture_output=True, text=True,
    )  # fmt: skip
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def medians(
    script: str, trees: dict[str, str], args: list[str], repeat: int
) -> dict[str, dict[str, float]]:
    """Per checkout of `trees` (name: tree), each figure's median over `repeat` rounds.

    Each round runs every checkout once, the last named first (the baseline, listed
    after "this"), so that a change in the machine's load spreads over both.
    """
    runs: dict[str, list[dict[str, float]]] = {who: [] for who in trees}
    for _ in range(repeat):
        for who, tree in reversed(trees.items()):
            runs[who].append(worker(script, tree, args))
    return {
        who: {key: statistics.median(run[key] for run in done) for key in done[0]}
        for who, done in runs.items()
    }
