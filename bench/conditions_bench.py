"""Measure what a plugin costs where its match conditions exclude every call.

    python -m bench.conditions_bench [--turns N] [--rounds N] [--facets]

A plugin process on every seam (`every_seam_plugin.py --match-nothing`: an agent label
no agent has on each subscription, and each seam's own condition besides) against no
plugin at all, on the standard workload (a tool step, then a text step), in one run:
the two sides alternate for `--rounds` rounds, and each side's best round counts. The
figures are the turn's latency and the server's CPU per turn, their ratios (target
≤ 1.05×), and the calls the plugin was sent (0: every call skipped) against those
skipped. On a shared machine time moves with the load; the Python function calls per
turn (cProfile's count, as the cost budget counts them) do not, and their ratio is
printed too. `--facets` measures a plugin whose tool-name and event-kind conditions
alone exclude every call (its agent conditions admit the agent) instead. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time

# isort: off
import server  # noqa: F401  # first: the server's gRPC settings apply before grpc loads
# isort: on

from bench.common import OPTIONS, PROMPT, line
from bench.plugin_bench import start, stop
from server.edge.app import App
from server.plugins.registry import Overrides
from server.settings.config import Config

WARM_UP = 20
"""Turns run before the measured ones (imports, caches, the stream's first call)."""
PROFILED = 50
"""Turns run after the timed ones under cProfile, to count function calls per turn."""
CALLS: dict[str | None, float] = {}
"""Python function calls per turn of the last run, by plugin address (None: none)."""


async def turns(address: str | None, count: int) -> tuple[float, float, int, int]:
    """µs and server CPU µs per turn, with the plugin at `address` or none; its calls
    made and skipped during the measured turns."""
    app = App(Config(listen="127.0.0.1:0", store="memory"))
    await app.start()
    try:
        if address is not None:
            await app.plugins.register(address, Overrides())
        agent = await app.factory.create("bench", OPTIONS)
        for _ in range(WARM_UP):
            agent.send(PROMPT)
            await agent.when_idle()
        stats = [plugin.stats for plugin in app.plugins.plugins.values()]
        calls = sum(s.calls for s in stats)
        skipped = sum(sum(s.skipped.values()) for s in stats)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            agent.send(PROMPT)
            await agent.when_idle()
        wall = (time.perf_counter() - started) / count * 1e6
        cpu = (time.process_time() - cpu) / count * 1e6
        made = sum(s.calls for s in stats) - calls
        skipped = sum(sum(s.skipped.values()) for s in stats) - skipped
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(PROFILED):
            agent.send(PROMPT)
            await agent.when_idle()
        profile.disable()
        CALLS[address] = pstats.Stats(profile).total_calls / PROFILED  # type: ignore[attr-defined]
        return wall, cpu, made, skipped
    finally:
        await app.stop(grace=5)


async def main(count: int, rounds: int, facets: bool = False) -> None:
    if facets:
        print(f"a plugin whose tool and event-kind conditions match nothing ({count} turns)")
    else:
        print(f"a plugin whose conditions match nothing, on every seam ({count} turns, 2 steps)")
    mode = "--match-no-facet" if facets else "--match-nothing"
    plugin, address = await start("every_seam_plugin.py", mode)
    try:
        runs: dict[str | None, list[tuple[float, float, int, int]]] = {None: [], address: []}
        for _ in range(rounds):  # alternated: the machine may be shared
            for side in runs:
                runs[side].append(await turns(side, count))
    finally:
        await stop(plugin)
    without, with_plugin = min(r[0] for r in runs[None]), min(r[0] for r in runs[address])
    cpu_without, cpu_with = min(r[1] for r in runs[None]), min(r[1] for r in runs[address])
    made = sum(r[2] for r in runs[address])
    skipped = sum(r[3] for r in runs[address]) / (rounds * count)
    line("turn without plugins", f"{without:,.0f} µs")
    line("turn with the plugin (its conditions match nothing)", f"{with_plugin:,.0f} µs")
    line("  latency ratio", f"{with_plugin / without:.3f}×", "≤ 1.05×")
    line("server CPU per turn without plugins", f"{cpu_without:,.0f} µs")
    line("server CPU per turn with the plugin", f"{cpu_with:,.0f} µs")
    line("  CPU ratio", f"{cpu_with / cpu_without:.3f}×", "≤ 1.05×")
    line("Python function calls per turn without plugins", f"{CALLS[None]:,.0f}")
    line("Python function calls per turn with the plugin", f"{CALLS[address]:,.0f}")
    line("  function calls ratio", f"{CALLS[address] / CALLS[None]:.3f}×", "≤ 1.05×")
    line("calls sent to the plugin (all rounds)", f"{made:,}", "0")
    line("calls skipped per turn (counted)", f"{skipped:,.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--facets", action="store_true", help="tool and event-kind conditions")
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.rounds, args.facets))
