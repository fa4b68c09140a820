"""The benchmark conversation on agentloop and on other agent frameworks, in one run.

    python -m bench.peers_bench [--turns 300] [--window 50] [--repeat 1] [--python PATH]

The design's target: at least 5× ahead of the peers per turn, and flat over a long
conversation where the peers grow. Each system runs the benchmark workload (a prompt,
one `word_count` tool call, the tool, a short answer) as one conversation of `--turns`
turns in a fresh process of its own, after a warm-up conversation of 10 turns; printed
for each, the median CPU and wall time of the first and of the last `--window` turns,
the growth (last ÷ first), each peer's ratio to agentloop, and the process's peak RSS.

agentloop runs in process on the memory store, its scripted model streaming as it
does; each peer (`bench/peers/`: the OpenAI Agents SDK's `Runner`, LangChain's
`create_agent` on LangGraph with an in-memory checkpointer) runs with a model scripted
in its own model interface, under `--python` (default `.venv-peers/bin/python`, which
`make peers` installs with the versions pinned in `bench/peers/requirements.txt`). A
peer that is not installed there is named, with how to install it, and skipped.
With `--repeat N` the systems take turns N times and each figure is the median.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench import common

PEERS = {
    "OpenAI Agents SDK": "bench.peers.agents_sdk_peer",
    "LangGraph (create_agent)": "bench.peers.langgraph_peer",
}
"""Each peer's worker module, run under the peers' interpreter."""

AGENTLOOP = "agentloop"

FIGURES = ("first_cpu_us", "last_cpu_us", "first_us", "last_us", "peak_rss_mb")


def agentloop_worker(turns: int, window: int) -> None:
    """agentloop's conversation, in process on the memory store (this interpreter)."""
    from bench.peers import Turn, conversation, report
    from server.lifecycle.factory import AgentFactory
    from server.lifecycle.runtime import build_runtime
    from server.settings.config import Config

    with tempfile.TemporaryDirectory() as data_dir:
        runtime = build_runtime(Config(store="memory", data_dir=data_dir))
        factory = AgentFactory(runtime)
        names = iter(range(1_000_000))

        async def new() -> Turn:
            agent = await factory.create(f"c{next(names)}", common.OPTIONS)

            async def turn() -> None:
                await common.one_turn(agent)

            return turn

        report(conversation(new, turns, window))


def run(command: list[str]) -> dict[str, float] | str:
    """A worker's figures, or why it gave none (its last error line)."""
    env = dict(os.environ, PYTHONPATH=str(common.ROOT))
    done = subprocess.run(command, env=env, cwd=common.ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        return lines[-1]
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=1, help="rounds; figures are medians")
    parser.add_argument("--python", default=str(common.ROOT / ".venv-peers" / "bin" / "python"),
                        help="the interpreter the peers are installed in")  # fmt: skip
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = ["--turns", str(args.turns), "--window", str(args.window)]
    if args.worker:
        agentloop_worker(args.turns, args.window)
        return
    commands = {AGENTLOOP: [sys.executable, "-m", "bench.peers_bench", "--worker", *size]}
    missing: dict[str, str] = {}
    for name, module in PEERS.items():
        if not os.path.exists(args.python):
            missing[name] = f"no interpreter at {args.python}: `make peers` installs the peers"
        else:
            commands[name] = [args.python, "-m", module, *size]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    for _ in range(args.repeat):
        for name, command in commands.items():
            figures = run(command)
            if isinstance(figures, str):
                missing[name] = figures
            else:
                runs[name].append(figures)
    medians = {
        name: {f: statistics.median(r[f] for r in results) for f in FIGURES}
        for name, results in runs.items()
        if results and name not in missing
    }
    print(f"one conversation of {args.turns} turns (a tool call, the tool, a short answer), "
          f"medians of the first and last {args.window} turns, {args.repeat} round(s)")  # fmt: skip
    ours = medians.get(AGENTLOOP)
    for name, m in medians.items():
        print(f"  {name}")
        common.line("    CPU per turn, first turns", f"{m['first_cpu_us']:,.0f} µs")
        common.line("    CPU per turn, last turns", f"{m['last_cpu_us']:,.0f} µs")
        common.line("    growth over the conversation (CPU)",
                    f"{m['last_cpu_us'] / m['first_cpu_us']:.2f}×")  # fmt: skip
        common.line("    wall per turn, first and last turns",
                    f"{m['first_us']:,.0f} / {m['last_us']:,.0f} µs")  # fmt: skip
        common.line("    peak RSS", f"{m['peak_rss_mb']:.1f} MB")
        if ours is not None and name != AGENTLOOP:
            first = m["first_cpu_us"] / ours["first_cpu_us"]
            last = m["last_cpu_us"] / ours["last_cpu_us"]
            common.line("    ÷ agentloop, first turns (CPU)", f"{first:.1f}×", "≥ 5×")
            common.line("    ÷ agentloop, last turns (CPU)", f"{last:.1f}×")
    for name, why in missing.items():
        print(f"  {name}: not measured ({why})")
    if AGENTLOOP in missing:
        raise SystemExit(f"agentloop's worker failed: {missing[AGENTLOOP]}")


if __name__ == "__main__":
    main()
