"""What metrics and traces cost per turn: off, and on with an exporter that drops spans.

Workload: the loop benchmark's turn (two steps, one word_count call, memory store), in
process. Each round runs the same number of turns on a fresh runtime with telemetry
off, with metrics only, and with metrics and traces, in rotating order; the figures
are the medians of the per-round ratios to off.

    python -m bench.telemetry_bench [--turns N] [--rounds N]

Nothing here asserts a timing: the figures are printed next to their targets.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bench.loop_bench import OPTIONS, line, one_turn
from server.app import build_runtime
from server.config import Config
from server.factory import AgentFactory
from server.telemetry import Telemetry
from server.tracing import Tracing


class DropSpans(SpanExporter):
    """Exports nothing: what remains is the cost of making and batching the spans."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop the batch."""
        return SpanExportResult.SUCCESS


MODES = ("off", "metrics", "metrics+traces")


async def per_turn(turns: int, mode: str) -> float:
    """µs per independent turn in `mode` (one of MODES)."""
    config = Config(store="memory", metrics_listen="" if mode == "off" else "127.0.0.1:0")
    runtime = build_runtime(config)
    factory = AgentFactory(runtime)
    traced = mode == "metrics+traces"
    telemetry = Telemetry(config, Tracing(BatchSpanProcessor(DropSpans())) if traced else None)
    telemetry.install(runtime.seams, lambda: len(factory.agents), lambda: 0, dict)
    await telemetry.start()
    try:
        warm = await factory.create("warm", OPTIONS)
        for _ in range(20):
            await one_turn(warm)
        agents = [await factory.create(f"a{i}", OPTIONS) for i in range(turns)]
        gc.collect()
        start = time.perf_counter()
        for agent in agents:
            await one_turn(agent)
        return (time.perf_counter() - start) / turns * 1e6
    finally:
        await factory.close()
        await telemetry.stop()


async def bench(turns: int, rounds: int) -> None:
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for i in range(rounds):
        for mode in MODES[i % 3 :] + MODES[: i % 3]:
            times[mode].append(await per_turn(turns, mode))
    print(f"telemetry per turn ({rounds} rounds of {turns} turns, medians)")
    line("off: no metrics, no traces", f"{statistics.median(times['off']):,.0f} µs/turn", "")
    for mode in MODES[1:]:
        ratios = [on / off for on, off in zip(times[mode], times["off"], strict=True)]
        line(f"{mode} (any spans dropped)", f"{statistics.median(times[mode]):,.0f} µs/turn", "")
        line(f"  {mode} / off", f"{statistics.median(ratios):.2f}×", "≤ 1.2×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    asyncio.run(bench(args.turns, args.rounds))


if __name__ == "__main__":
    main()
