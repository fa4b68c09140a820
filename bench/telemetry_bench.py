"""What metrics and traces cost per turn: off, and on with an exporter that drops spans.

Workload: the loop benchmark's turn (two steps, one word_count call, memory store), in
process. Each round runs the same number of turns on a fresh runtime with telemetry
off, with metrics only, and with metrics and traces, in rotating order; the figures
are the medians of the per-round ratios to off.

    python -m bench.telemetry_bench [--turns N] [--rounds N] [--no-grpc]

The gRPC section does the same end to end: a server process per mode (its spans go
to an exporter that drops them), one agent, turns sent with SendMessage and read
off StreamSessionEvents, so the access log of every RPC is in every mode.

Nothing here asserts a timing: the figures are printed next to their targets.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from agentloop.client import connect
from bench.loop_bench import OPTIONS, free_port, line, one_turn
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


# The server process's prelude: "drop" names an exporter that drops every span.
PRELUDE = (
    "import server.tracing as t; from bench.telemetry_bench import DropSpans; "
    "built = t.build_exporter; "
    "t.build_exporter = lambda n, e: DropSpans() if n == 'drop' else built(n, e)"
)
MAIN = "import sys; from server.__main__ import main; sys.exit(main(sys.argv[1:]))"


async def grpc_per_turn(turns: int, mode: str) -> float:
    """µs per turn through a server process in `mode`, one agent, seen on its stream."""
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="agentloop-bench-")
    argv = ["--listen", f"127.0.0.1:{port}", "--data-dir", data_dir]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if mode != "off":
        argv += ["--metrics-listen", str(free_port())]
    if mode == "metrics+traces":
        env["OTEL_TRACES_EXPORTER"] = "drop"
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-c", f"{PRELUDE}\n{MAIN}", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        await server.stdout.readline()  # "agentloop listening on ..."
        client = connect(f"127.0.0.1:{port}")
        await client.create("b", OPTIONS)
        # The SDK's conversation: one stream, each send's answering turn read to its end.
        async with client.conversation("b") as chat:

            async def turn() -> None:
                await (await chat.send("count me")).result()

            for _ in range(20):
                await turn()
            start = time.perf_counter()
            for _ in range(turns):
                await turn()
            per_turn = (time.perf_counter() - start) / turns * 1e6
        await client.close()
        return per_turn
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)
        shutil.rmtree(data_dir, ignore_errors=True)


async def bench_grpc(turns: int, rounds: int) -> None:
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for i in range(rounds):
        for mode in MODES[i % 3 :] + MODES[: i % 3]:
            times[mode].append(await grpc_per_turn(turns, mode))
    print(f"telemetry per turn over gRPC ({rounds} rounds of {turns} turns, medians)")
    line("off: no metrics, no traces", f"{statistics.median(times['off']):,.0f} µs/turn", "")
    for mode in MODES[1:]:
        ratios = [on / off for on, off in zip(times[mode], times["off"], strict=True)]
        line(f"{mode} (any spans dropped)", f"{statistics.median(times[mode]):,.0f} µs/turn", "")
        line(f"  {mode} / off", f"{statistics.median(ratios):.2f}×", "≤ 1.2×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--no-grpc", action="store_true", help="skip the end-to-end figure")
    args = parser.parse_args()
    asyncio.run(bench(args.turns, args.rounds))
    if not args.no_grpc:
        asyncio.run(bench_grpc(args.turns, args.rounds))


if __name__ == "__main__":
    main()
