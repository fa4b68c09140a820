"""One long conversation in process: does a turn cost more as the history grows?

    python -m bench.conversation_bench [--turns 3000] [--at 1,1000,3000] [--window 50]
                                       [--store memory|sqlite] [--baseline DIR] [--repeat 3]

One agent runs `--turns` turns of the benchmark workload (a tool call, the tool, a short
text: two steps) in one conversation, each turn timed (wall and CPU of this process). The
CPU per turn is printed at each turn of `--at`: the median of the `--window` turns that
end there (turns 1 to `--window` for the first; a median, so that another process
taking the core for a moment does not move it). With `--baseline`, another checkout's
loop runs the same conversation in its own process, interleaved with this one's, and
the medians of `--repeat` rounds are printed side by side. Figures are printed, never
asserted.

Runs as a script too (`python bench/conversation_bench.py --worker`), with another
checkout first on PYTHONPATH (`bench.common.worker`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time

from agentloop.v1 import content_pb2 as c
from bench import common
from bench.common import OPTIONS, PROMPT, checkouts
from server.lifecycle.factory import AgentFactory
from server.lifecycle.runtime import build_runtime
from server.loop.agent import Agent
from server.settings.config import Config


async def timed_turn(agent: Agent, prompt: list[c.ContentBlock]) -> tuple[float, float]:
    """(wall s, CPU s of this process) of one turn of `agent`."""
    wall, cpu = time.perf_counter(), time.process_time()
    agent.send(prompt)
    await agent.when_idle()
    return time.perf_counter() - wall, time.process_time() - cpu


async def conversation(
    store: str, turns: int, warmup: int = 20, text: str = "", control: int = 0
) -> list[tuple[float, float, float]]:
    """(wall s, CPU s, control CPU s) of each turn of one conversation of `turns` turns.

    Each turn answers `text` (the benchmark prompt by default). A separate agent runs
    `warmup` turns first, so that the first measured turn is not the process's first.
    With `control`, each turn is followed by a turn of a short conversation (a new one
    every `control` turns), timed too: the same moment's cost of a turn whose history
    is short, to tell a longer history from a busier machine. Else that CPU is 0.
    """
    prompt = [c.ContentBlock(text=c.TextBlock(text=text))] if text else PROMPT
    with tempfile.TemporaryDirectory() as data_dir:
        runtime = build_runtime(Config(store=store, data_dir=data_dir))
        factory = AgentFactory(runtime)
        warm = await factory.create("warm", OPTIONS)
        for _ in range(warmup):
            await timed_turn(warm, prompt)
        agent = await factory.create("conversation", OPTIONS)
        gc.collect()
        out = []
        short_agent = None
        for i in range(turns):
            wall, cpu = await timed_turn(agent, prompt)
            short = 0.0
            if control:
                if i % control == 0:
                    if short_agent is not None:
                        await factory.dispose(short_agent.agent_id)
                    short_agent = await factory.create(f"short-{i}", OPTIONS)
                assert short_agent is not None
                _, short = await timed_turn(short_agent, prompt)
            out.append((wall, cpu, short))
        await factory.close()
        await runtime.store.close()
    return out


def windows(costs: list[float], at: list[int], width: int) -> dict[int, float]:
    """Median cost of the `width` turns ending at each turn of `at` (1-based)."""
    out = {}
    for turn in at:
        end = min(max(turn, width), len(costs))
        out[turn] = statistics.median(costs[max(0, end - width) : end])
    return out


def span(costs: list[tuple[float, float, float]], first: int, last: int) -> dict[str, float]:
    """Of turns `first` to `last` (0-based, inclusive): the median wall and the mean CPU, µs."""
    turns = costs[first : last + 1]
    return {
        "wall_p50": statistics.median(w for w, _, _ in turns) * 1e6,
        "cpu": statistics.fmean(c for _, c, _ in turns) * 1e6,
    }


def worker(store: str, turns: int, at: list[int], width: int) -> dict[str, float]:
    """At each turn of `at`, in this process: the CPU µs per turn, and its ratio to the
    CPU per turn of the short conversations run at the same moments."""
    costs = asyncio.run(conversation(store, turns, control=width))
    cpu = windows([c for _, c, _ in costs], at, width)
    short = windows([s for _, _, s in costs], at, width)
    return {f"{k}": cpu[k] * 1e6 for k in at} | {f"{k}/short": cpu[k] / short[k] for k in at}


def span_in_tree(tree: str, text: str, first: int, last: int) -> dict[str, float]:
    """`span` of one conversation of `last + 1` turns on SQLite, in a fresh process.

    The loop is checkout `tree`'s (this one's if ""); each turn answers `text`.
    """
    args = ["--store", "sqlite", "--turns", str(last + 1), "--span", f"{first},{last}"]
    return in_tree(tree, [*args, "--text", text])


def in_tree(tree: str, args: list[str]) -> dict[str, float]:
    """A `--worker` run in a fresh process over the loop of checkout `tree` (this one if "")."""
    return common.worker(__file__, tree, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--at", default="1,1000,3000", help="comma-separated turn numbers")
    parser.add_argument("--window", type=int, default=50, help="turns averaged at each point")
    parser.add_argument("--store", default="memory", choices=("memory", "sqlite"))
    parser.add_argument("--baseline", default="", help="another checkout to compare with")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (each a fresh process)")
    parser.add_argument("--worker", action="store_true", help="one run; print JSON")
    parser.add_argument("--span", default="", help="with --worker: FIRST,LAST turns (0-based)")
    parser.add_argument("--text", default="", help="with --worker: the message of each turn")
    args = parser.parse_args()
    at = [int(t) for t in args.at.split(",")]
    if args.worker and args.span:
        first, last = (int(t) for t in args.span.split(","))
        costs = asyncio.run(conversation(args.store, args.turns, text=args.text))
        print(json.dumps(span(costs, first, last)))
        return
    if args.worker:
        print(json.dumps(worker(args.store, args.turns, at, args.window)))
        return
    report(args.turns, at, args.window, args.store, args.baseline, args.repeat)


def report(turns: int, at: list[int], width: int, store: str, baseline: str, repeat: int) -> None:
    """Print the CPU per turn at each turn of `at`: medians of `repeat` processes per tree."""
    passed = ["--turns", str(turns), "--at", ",".join(map(str, at)), "--window", str(width)]
    passed += ["--store", store]
    trees = checkouts(baseline)
    runs: dict[str, list[dict[str, float]]] = {who: [] for who in trees}
    for _ in range(repeat):
        for who, tree in reversed(trees.items()):  # the baseline first in each round
            runs[who].append(in_tree(tree, passed))
    print(f"one conversation of {turns:,} turns in process ({store} store): CPU µs per turn,"
          f" median of the {width} turns ending at each point, then of {repeat} process(es)"
          + (f"; baseline {baseline}" if baseline else ""))  # fmt: skip
    print(f"  and / short: against turns of short conversations (at most {width} turns) run"
          " between them, in the same process")  # fmt: skip
    keys = [f"{t}" for t in at] + [f"{t}/short" for t in at]
    med = {who: {k: statistics.median(r[k] for r in rs) for k in keys} for who, rs in runs.items()}
    print(f"  {'turn':<16}" + "".join(f"{t:>10,}" for t in at) + f"{'last/first':>12}"
          + "".join(f"{f'{t:,} / short':>16}" for t in at))  # fmt: skip
    for who in reversed(trees):
        m = med[who]
        print(f"  {who:<16}" + "".join(f"{m[f'{t}']:>10,.0f}" for t in at)
              + f"{m[f'{at[-1]}'] / m[f'{at[0]}']:>11.2f}×"
              + "".join(f"{m[f'{t}/short']:>15.2f}×" for t in at))  # fmt: skip
    if baseline:
        ratios = [med["this"][f"{t}"] / med["baseline"][f"{t}"] for t in at]
        print(f"  {'this / baseline':<16}" + "".join(f"{r:>10.2f}" for r in ratios))


if __name__ == "__main__":
    main()
