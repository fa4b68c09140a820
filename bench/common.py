"""What the benches share: the workload, /proc readings, the printed line, other checkouts.

The workload of one turn (the design notes' "Performance targets"): the scripted model
asks for one tool call (word_count, an async tool), the tool runs, the model answers
with a short text: two steps, one tool.

A worker is a bench script run in a fresh process with another checkout first on
PYTHONPATH, so that it measures that checkout's server and SDK; it prints its figures
as one JSON object on its last line. Its `bench` package is this one (`checkout_env`),
so a worker may import this module even over a checkout that predates it. This module
imports nothing of the server: a worker's server is the other checkout's.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agentloop.v1 import agent_pb2
from agentloop.v1 import content_pb2 as c

if TYPE_CHECKING:
    from server.loop.agent import Agent

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = agent_pb2.AgentOptions(provider="scripted", model="bench", tools=["word_count"])
PROMPT = [c.ContentBlock(text=c.TextBlock(text="count the words of this short prompt"))]


async def one_turn(agent: Agent) -> None:
    """One turn of the workload, to its end."""
    agent.send(PROMPT)
    await agent.when_idle()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def line(label: str, value: str, target: str = "") -> None:
    """One figure, with its target when it has one."""
    print(f"  {label:<52} {value:>14}   {'target ' + target if target else ''}".rstrip())


# -- a process, from /proc (Linux) --------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(path: str) -> list[str]:
    """The fields of a /proc stat file after the command name (which may hold spaces)."""
    return Path(path).read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all threads) process `pid` used so far; 0 without /proc."""
    try:
        fields = _stat(f"/proc/{pid}/stat")
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def kernel_seconds(pid: int) -> float:
    """System CPU time of process `pid` (all threads): its syscalls, socket and file I/O."""
    return int(_stat(f"/proc/{pid}/stat")[12]) / TICKS


def main_thread_seconds(pid: int) -> float:
    """CPU time of the main thread (its event loop) of `pid`, not gRPC's own threads."""
    fields = _stat(f"/proc/{pid}/task/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int | None = None) -> float:
    """The resident set size of process `pid` (this one by default), in MB."""
    with open(f"/proc/{pid or os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 1e6


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def loop_probe(running: asyncio.Event) -> float:
    """The longest wall seconds between two of its turns on the loop, while `running`."""
    longest = 0.0
    last = time.perf_counter()
    while running.is_set():
        await asyncio.sleep(0)
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    return longest


def instructions(out: str) -> int:
    """The total instruction count of a cachegrind output file."""
    with open(out) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("summary:"))


def counted_turns(turns: str) -> tuple[int, int] | None:
    """The two turn counts `FEW,MANY` of an instructions bench; None, said, without valgrind."""
    few, many = (int(n) for n in turns.split(","))
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing counted")
        return None
    return few, many


def counted_run(args: list[str], tree: str) -> int:
    """Instructions of `python ARGS` over checkout `tree` under cachegrind, hash seed fixed.

    Every thread's user-space instructions; the process must end by itself.
    """
    with tempfile.TemporaryDirectory(prefix="agentloop-cachegrind-") as scratch:
        out = str(Path(scratch) / "cachegrind.out")
        subprocess.run(
            ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
             sys.executable, *args],
            env=dict(checkout_env(tree), PYTHONHASHSEED="0"),
            cwd=tree or ROOT, check=True, capture_output=True,
        )  # fmt: skip
        return instructions(out)


# -- other checkouts ----------------------------------------------------------------------

_SHIM: list[str] = []


def checkout_env(tree: str) -> dict[str, str]:
    """The environment of a process over checkout `tree` (this one if "").

    Its server and SDK first on PYTHONPATH, and this `bench` package before them.
    """
    if not tree:
        here = os.pathsep.join([str(ROOT), str(ROOT / "clients/python")])
        return dict(os.environ, PYTHONPATH=here)
    if not _SHIM:
        _SHIM.append(tempfile.mkdtemp(prefix="agentloop-bench-shim-"))
        atexit.register(shutil.rmtree, _SHIM[0], True)
        (Path(_SHIM[0]) / "bench").symlink_to(ROOT / "bench")
    root = Path(tree)
    paths = [_SHIM[0], str(root), str(root / "clients/python")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def checkouts(baseline: str) -> dict[str, str]:
    """This checkout, and `baseline` when one is named: name → tree ("" is this one)."""
    return {"this": ""} | ({"baseline": baseline} if baseline else {})


def worker(script: str, tree: str, args: list[str]) -> dict[str, float]:
    """The figures of one `script --worker ARGS` run over checkout `tree` (this one if "")."""
    done = subprocess.run(
        [sys.executable, str(Path(script).resolve()), "--worker", *args],
        env=checkout_env(tree), cwd=tree or ROOT, check=True, capture_output=True, text=True,
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
