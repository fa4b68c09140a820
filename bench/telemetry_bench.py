"""What metrics and traces cost per turn: off, and on with an exporter that drops spans.

Workload: the loop benchmark's turn (two steps, one word_count call, memory store), in
process. Each round runs the same number of turns on a fresh runtime with telemetry
off, with metrics only, and with metrics and traces, in rotating order; the figures
are the medians of the per-round ratios to off. Cost is CPU time (of the whole
process: the event loop and the span processor's thread), which other work on a
shared machine disturbs far less than wall time; the wall time is printed beside it.

    python -m bench.telemetry_bench [--turns N] [--rounds N] [--no-grpc]

The gRPC section does the same end to end: a server process per mode (its spans go
to an exporter that drops them), one agent, turns sent with SendMessage and read
off StreamSessionEvents, so the access log of every RPC is in every mode. Its cost
is the CPU time per turn of the server's event-loop thread (from /proc), where every
span, metric and log line is made (the span processor's export thread, which drops
the spans here, is left out; so are gRPC's own threads, whose CPU grows with the wall
time a turn takes on a busy machine); the wall time is beside it.

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
from bench.common import OPTIONS, free_port, line, main_thread_seconds, one_turn
from server.lifecycle.factory import AgentFactory
from server.lifecycle.runtime import build_runtime
from server.observability.telemetry import Telemetry
from server.observability.tracing import Tracing
from server.settings.config import Config


class DropSpans(SpanExporter):
    """Exports nothing: what remains is the cost of making and batching the spans."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop the batch."""
        return SpanExportResult.SUCCESS


MODES = ("off", "metrics", "metrics+traces")


async def per_turn(turns: int, mode: str) -> tuple[float, float]:
    """CPU and wall µs per independent turn in `mode` (one of MODES)."""
    config = Config(store="memory", metrics_listen="" if mode == "off" else "127.0.0.1:0")
    runtime = build_runtime(config)
    factory = AgentFactory(runtime)
    traced = mode == "metrics+traces"
    telemetry = Telemetry(config, Tracing(BatchSpanProcessor(DropSpans())) if traced else None)
    telemetry.install(runtime.seams, lambda: len(factory.agents), lambda: 0, lambda: 0, dict, {})
    await telemetry.start()
    try:
        warm = await factory.create("warm", OPTIONS)
        for _ in range(20):
            await one_turn(warm)
        agents = [await factory.create(f"a{i}", OPTIONS) for i in range(turns)]
        gc.collect()
        cpu, start = time.process_time(), time.perf_counter()
        for agent in agents:
            await one_turn(agent)
        wall = time.perf_counter() - start
        return (time.process_time() - cpu) / turns * 1e6, wall / turns * 1e6
    finally:
        await factory.close()
        await telemetry.stop()


def report(title: str, times: dict[str, list[tuple[float, float]]]) -> None:
    """Medians of CPU and wall µs per turn, and of the per-round CPU ratios to off."""
    print(title)

    def figure(mode: str) -> str:
        cpu = statistics.median(t[0] for t in times[mode])
        wall = statistics.median(t[1] for t in times[mode])
        return f"{cpu:,.0f} µs CPU/turn ({wall:,.0f} wall)"

    line("off: no metrics, no traces", figure("off"), "")
    for mode in MODES[1:]:
        ratios = [on[0] / off[0] for on, off in zip(times[mode], times["off"], strict=True)]
        line(f"{mode} (any spans dropped)", figure(mode), "")
        line(f"  {mode} / off (CPU)", f"{statistics.median(ratios):.2f}×", "≤ 1.2×")


async def bench(turns: int, rounds: int) -> None:
    times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for i in range(rounds):
        for mode in MODES[i % 3 :] + MODES[: i % 3]:
            times[mode].append(await per_turn(turns, mode))
    report(f"telemetry per turn, in process ({rounds} rounds of {turns} turns, medians)", times)


# The server process's prelude: "drop" names an exporter that drops every span.
PRELUDE = (
    "import server.observability.tracing as t; from bench.telemetry_bench import DropSpans; "
    "built = t.build_exporter; "
    "t.build_exporter = lambda n, e: DropSpans() if n == 'drop' else built(n, e)"
)
MAIN = "import sys; from server.__main__ import main; sys.exit(main(sys.argv[1:]))"


async def grpc_per_turn(turns: int, mode: str) -> tuple[float, float]:
    """The server's event-loop CPU µs and the wall µs per turn through a server in `mode`."""
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
            cpu, start = main_thread_seconds(server.pid), time.perf_counter()
            for _ in range(turns):
                await turn()
            wall = time.perf_counter() - start
            used = main_thread_seconds(server.pid) - cpu
        await client.close()
        return used / turns * 1e6, wall / turns * 1e6
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)
        shutil.rmtree(data_dir, ignore_errors=True)


async def bench_grpc(turns: int, rounds: int) -> None:
    times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for i in range(rounds):
        for mode in MODES[i % 3 :] + MODES[: i % 3]:
            times[mode].append(await grpc_per_turn(turns, mode))
    title = (
        f"telemetry per turn over gRPC, server loop CPU ({rounds} rounds of {turns} turns, medians)"
    )
    report(title, times)


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
