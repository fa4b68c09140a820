"""What metrics and traces cost per turn: off, and on with an exporter that drops spans.

Workload: the loop benchmark's turn (two steps, one word_count call, memory store), in
process. Each round runs the same number of turns on a fresh runtime with telemetry
off and on, in alternating order; the figure is the median of the per-round ratios.

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


async def per_turn(turns: int, on: bool) -> float:
    """µs per independent turn, telemetry on or off."""
    config = Config(store="memory", metrics_listen="127.0.0.1:0" if on else "")
    runtime = build_runtime(config)
    factory = AgentFactory(runtime)
    telemetry = Telemetry(config, Tracing(BatchSpanProcessor(DropSpans())) if on else None)
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
    offs: list[float] = []
    ons: list[float] = []
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        for on in order:
            (ons if on else offs).append(await per_turn(turns, on))
    ratios = [on / off for on, off in zip(ons, offs, strict=True)]
    print(f"telemetry per turn ({rounds} rounds of {turns} turns, medians)")
    line("off: no metrics, no traces", f"{statistics.median(offs):,.0f} µs/turn", "")
    line("on: metrics + traces (spans dropped)", f"{statistics.median(ons):,.0f} µs/turn", "")
    line("on / off", f"{statistics.median(ratios):.2f}×", "≤ 1.2×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(bench(args.turns, args.rounds))


if __name__ == "__main__":
    main()
