"""Measure remote seams: one call on an open plugin stream, and a step with a plugin on every seam.

    python -m bench.plugin_bench [--calls N] [--turns N] [--chunk-turns N]
    python -m bench.plugin_bench --observer [--chunk-turns N] [--buffer N]   # observer only
    python -m bench.plugin_bench --baseline DIR [--repeat N]   # A/B against a checkout

Both plugins run as separate processes, as they would in production:
- a bare `Handle` echo server (raw grpc.aio, no SDK): the floor, a bidi ping-pong;
- the same through the Python plugin SDK, subscribed to every seam, answering "continue";
- the SDK as a session-event observer only: the CPU a 10,000-chunk turn costs with it;
- the SDK plugin on every seam again, served on a Unix domain socket (`unix:`), where
  the checkout supports it (the server's allowlist then names the socket).
The figures are printed next to their targets; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# isort: off
import server  # noqa: F401  # first: the server's gRPC settings apply before grpc loads
import grpc
# isort: on

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import hook_service_pb2_grpc as hk_rpc
from agentloop.v1 import agent_pb2, scripted_pb2
from bench.common import OPTIONS, PROMPT, checkout_env, cpu_seconds
from server.edge.app import App
from server.kernel.abort import NEVER
from server.models.scripted_options import script_options
from server.plugins.calls import PluginStats
from server.plugins.registry import Overrides
from server.settings.config import Config

try:
    from server.plugins.connection import PluginConnection
except ImportError:  # a checkout from before the connection's split (--baseline)
    from server.plugins.client import PluginConnection  # type: ignore[no-redef,import-not-found]

HERE = Path(__file__).resolve().parent


async def start(script: str, *args: str) -> tuple[asyncio.subprocess.Process, str]:
    """Start a plugin process; returns it and its address."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / script), *args, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 10)).decode()
    return process, line.rsplit(" ", 1)[-1].strip()


async def stop(process: asyncio.subprocess.Process) -> None:
    process.terminate()
    await asyncio.wait_for(process.wait(), 10)


FIGURES: dict[str, float] = {}
"""The figures of this run, by key (`--json` prints them; `--baseline` compares them)."""
QUIET = False


def line(label: str, value: str, target: str = "", key: str = "", figure: float = 0.0) -> None:
    if key:
        FIGURES[key] = figure
    if not QUIET:
        print(f"  {label:<56} {value:>12}   {target}")


async def ping_pong(address: str, calls: int) -> list[float]:
    """Raw bidi round trips on one open `Handle` stream, µs each."""
    async with grpc.aio.insecure_channel(address) as channel:
        stream = hk_rpc.HookServiceStub(channel).Handle()
        samples = []
        for i in range(calls + 200):
            call = hk.HookCall(call_id=str(i), seam=hk.SEAM_TURN_STOP, turn_stop=hk.TurnStopCall())
            request = hk.HandleRequest(call=call)
            started = time.perf_counter()
            await stream.write(request)
            await stream.read()
            if i >= 200:  # warm-up excluded
                samples.append((time.perf_counter() - started) * 1e6)
        stream.cancel()
    return samples


async def seam_calls(address: str, calls: int) -> list[float]:
    """Round trips through the server's plugin client, µs each."""
    connection = PluginConnection(address, "", PluginStats())
    connection.start()
    assert await connection.wait_ready(5)
    samples = []
    for i in range(calls + 200):
        call = hk.HookCall(
            call_id=f"b{i}", seam=hk.SEAM_TURN_STOP, agent_id="a", turn_stop=hk.TurnStopCall()
        )
        started = time.perf_counter()
        await connection.call(call, 5.0, NEVER)
        if i >= 200:
            samples.append((time.perf_counter() - started) * 1e6)
    await connection.close()
    return samples


def unix_supported() -> bool:
    """Whether this checkout's server takes plugins on Unix sockets (`unix:` addresses)."""
    from server.settings import addresses

    return hasattr(addresses, "UNIX_SCHEME")


def config_for(address: str | None) -> Config:
    """The bench server's config; a `unix:` plugin address is named in its allowlist."""
    if address is not None and address.startswith("unix:"):
        return Config(listen="127.0.0.1:0", store="memory", plugin_allowlist=(address,))
    return Config(listen="127.0.0.1:0", store="memory")


async def turns(address: str | None, count: int, pid: int = 0) -> tuple[float, float, float]:
    """Per turn of the standard workload, with or without the plugin registered: µs, and
    the CPU µs of this process (the server) and of the plugin process `pid`.

    Unlike latency, CPU does not grow with the machine's load: the figure to compare on
    a shared machine."""
    app = App(config_for(address))
    await app.start()
    try:
        if address is not None:
            await app.plugins.register(address, Overrides())
        agent = await app.factory.create("bench", OPTIONS)
        for _ in range(20):
            agent.send(PROMPT)
            await agent.when_idle()
        stats = [plugin.stats for plugin in app.plugins.plugins.values()]
        calls = sum(s.calls for s in stats)
        started, cpu, plugin_cpu = time.perf_counter(), time.process_time(), cpu_seconds(pid)
        with GcClock() as collecting:
            for _ in range(count):
                agent.send(PROMPT)
                await agent.when_idle()
        wall = (time.perf_counter() - started) / count * 1e6
        DECISIONS[address] = (sum(s.calls for s in stats) - calls) / count
        GC_US[address] = collecting.seconds / count * 1e6
        cpu = (time.process_time() - cpu) / count * 1e6
        return wall, cpu, (cpu_seconds(pid) - plugin_cpu) / count * 1e6 if pid else 0.0
    finally:
        await app.stop(grace=5)


DECISIONS: dict[str | None, float] = {}
"""Per plugin address, the calls the plugin answered per turn in the last `turns` run."""
GC_US: dict[str | None, float] = {}
"""Per plugin address, the µs per turn spent collecting garbage in the last `turns` run."""


class GcClock:
    """The time this process spends in garbage collections while it is on."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began


CHUNKS = 10_000
"""The chunks of the observer workload's one model call."""


async def chunk_turns_cpu(address: str | None, count: int) -> tuple[float, float]:
    """CPU seconds of this process per 10,000-chunk turn, with or without an observer,
    and the notifications dropped per turn (the observer's buffer overflowed)."""
    app = App(Config(listen="127.0.0.1:0", store="memory"))
    await app.start()
    try:
        if address is not None:
            await app.plugins.register(address, Overrides())
        step = scripted_pb2.ScriptedStep(text="x" * CHUNKS, chunk_size=1)
        options = agent_pb2.AgentOptions(
            provider="scripted",
            model="bench",
            provider_options=script_options([step] * (count + 1)),
        )
        agent = await app.factory.create("chunky", options)
        agent.send(PROMPT)  # warm-up
        await agent.when_idle()
        stats = [plugin.stats for plugin in app.plugins.plugins.values()]
        dropped_before = sum(s.dropped for s in stats)
        started = time.process_time()
        for _ in range(count):
            agent.send(PROMPT)
            await agent.when_idle()
        cpu = (time.process_time() - started) / count
        return cpu, (sum(s.dropped for s in stats) - dropped_before) / count
    finally:
        await app.stop(grace=5)


async def observer_cost(chunk_turns: int, buffer: int = 0) -> None:
    """The CPU of a 10,000-chunk turn with one session-event observer ÷ without.

    `buffer` sets the observer's buffer: large enough, no notification is dropped, and
    the ratio is the full cost of delivering every event.
    """
    sized = ("--buffer", str(buffer)) if buffer else ()
    observer, observer_address = await start("every_seam_plugin.py", "--observer-only", *sized)
    try:
        # Alternated, best of three each: the first server of a process runs colder, and
        # the machine may be shared.
        runs: dict[str | None, list[tuple[float, float]]] = {None: [], observer_address: []}
        for _ in range(3):
            for address in runs:
                runs[address].append(await chunk_turns_cpu(address, chunk_turns))
        without, (with_observer, dropped) = min(runs[None])[0], min(runs[observer_address])
    finally:
        await stop(observer)
    line(f"{CHUNKS:,}-chunk turn, CPU without plugins", f"{without * 1e3:,.0f} ms")
    line("same, one session-event observer of every event", f"{with_observer * 1e3:,.0f} ms")
    ratio = with_observer / without
    line("  CPU ratio", f"{ratio:.2f}×", "target ≤ 1.2×", "observer_cpu_ratio", ratio)
    # A full buffer drops notifications before they are built: fewer sent costs less CPU.
    line(
        "  notifications dropped per turn (buffer full)", f"{dropped:,.0f}", "", "dropped", dropped
    )


ROUNDS = 3
"""Each comparison alternates its sides this many times (the machine may be shared)."""


async def main(calls: int, turn_count: int, chunk_turns: int) -> None:
    if not QUIET:
        print("remote seams (plugins in their own processes, loopback)")
    bare, bare_address = await start("echo_plugin.py")
    sdk, sdk_address = await start("every_seam_plugin.py")
    quiet, quiet_address = await start("every_seam_plugin.py", "--turn-end-only")
    watching, watching_address = await start("every_seam_plugin.py", "--watch-only")
    sockets = tempfile.TemporaryDirectory(prefix="agentloop-bench-")
    local: asyncio.subprocess.Process | None = None
    local_address = ""
    if unix_supported():
        local, local_address = await start(
            "every_seam_plugin.py", "--listen", f"unix:{sockets.name}/every-seam.sock"
        )
    try:
        floors, raws, vias, ratios, locals_, local_ratios = [], [], [], [], [], []
        for _ in range(ROUNDS):  # alternated; each round's ratio, then their median
            floors.append(statistics.median(await ping_pong(bare_address, calls)))
            raws.append(statistics.median(await ping_pong(sdk_address, calls)))
            vias.append(statistics.median(await seam_calls(sdk_address, calls)))
            ratios.append(vias[-1] / floors[-1])
            if local is not None:
                locals_.append(statistics.median(await seam_calls(local_address, calls)))
                local_ratios.append(locals_[-1] / floors[-1])
        floor, raw_sdk, via_client = (statistics.median(x) for x in (floors, raws, vias))
        line("bare bidi ping-pong (raw client, raw echo server)", f"{floor:,.0f} µs", "",
             "bare_us", floor)  # fmt: skip
        line("raw client -> SDK plugin", f"{raw_sdk:,.0f} µs")
        line("remote seam call (server's plugin client -> SDK plugin)", f"{via_client:,.0f} µs",
             "", "seam_call_us", via_client)  # fmt: skip
        ratio = statistics.median(ratios)
        line(f"  ratio to the bare ping-pong (median of {ROUNDS} rounds)",
             f"{ratio:.2f}×", "target ≤ 1.15×", "seam_call_ratio", ratio)  # fmt: skip
        if local is not None:
            via_socket, socket_ratio = statistics.median(locals_), statistics.median(local_ratios)
            line("same over a Unix socket (unix:)", f"{via_socket:,.0f} µs", "",
                 "unix_seam_call_us", via_socket)  # fmt: skip
            line("  ratio to the bare (TCP) ping-pong", f"{socket_ratio:.2f}×", "",
                 "unix_call_ratio", socket_ratio)  # fmt: skip
        pids = {None: 0, sdk_address: sdk.pid, quiet_address: quiet.pid, watching_address: 0}
        if local is not None:
            pids[local_address] = local.pid
        runs: dict[str | None, list[tuple[float, float, float]]] = {a: [] for a in pids}
        for _ in range(2):  # alternated, best of two each
            for address, pid in pids.items():
                runs[address].append(await turns(address, turn_count, pid))
        without, with_plugin, filtered, watched = (
            min(r[0] for r in runs[a]) for a in (None, sdk_address, quiet_address, watching_address)
        )
        cpu_without, cpu_with = (min(r[1] for r in runs[a]) for a in (None, sdk_address))
        plugin_cpu = min(r[2] for r in runs[sdk_address])
        steps = 2  # the workload: a tool step, then a text step
        line(f"turn without plugins ({turn_count} turns, 2 steps)", f"{without:,.0f} µs", "",
             "turn_us", without)  # fmt: skip
        line("turn with one plugin on every seam", f"{with_plugin:,.0f} µs")
        added = (with_plugin - without) / steps
        line("  added latency per step", f"{added:,.0f} µs", "target ≤ 1,000 µs",
             "added_per_step_us", added)  # fmt: skip
        decisions = DECISIONS.get(sdk_address, 0.0) / steps
        least = decisions * floor  # the round trips alone, each waiting for the one before
        line(f"  its floor: {decisions:.1f} decisions per step × the bare ping-pong",
             f"{least:,.0f} µs", "", "floor_per_step_us", least)  # fmt: skip
        added = (cpu_with - cpu_without) / steps
        line("  server CPU added per step", f"{added:,.0f} µs", "", "server_cpu_per_step_us", added)
        added = plugin_cpu / steps
        line("  plugin process CPU per step", f"{added:,.0f} µs", "", "plugin_cpu_per_step_us",
             added)  # fmt: skip
        collecting = GC_US.get(sdk_address, 0.0)  # of the last run (the pair alternates)
        line("  garbage collection per turn (this process, the server)",
             f"{collecting:,.0f} µs", "", "gc_per_turn_us", collecting)  # fmt: skip
        line("same, its session-event observer asking for turn_end only", f"{filtered:,.0f} µs")
        added = (filtered - without) / steps
        line("  added latency per step", f"{added:,.0f} µs", "", "added_filtered_us", added)
        line("same plugin only watching every seam (observe_only)", f"{watched:,.0f} µs")
        added = (watched - without) / steps
        line("  added latency per step", f"{added:,.0f} µs", "", "added_watching_us", added)
        if local is not None:
            over_socket = min(r[0] for r in runs[local_address])
            line("the plugin on every seam over a Unix socket", f"{over_socket:,.0f} µs")
            added = (over_socket - without) / steps
            line("  added latency per step", f"{added:,.0f} µs", "",
                 "unix_added_us", added)  # fmt: skip
            added = (min(r[1] for r in runs[local_address]) - cpu_without) / steps
            line("  server CPU added per step", f"{added:,.0f} µs", "",
                 "unix_server_cpu_us", added)  # fmt: skip
            added = min(r[2] for r in runs[local_address]) / steps
            line("  plugin process CPU per step", f"{added:,.0f} µs", "",
                 "unix_plugin_cpu_us", added)  # fmt: skip
        await observer_cost(chunk_turns)
    finally:
        await stop(bare)
        await stop(sdk)
        await stop(quiet)
        await stop(watching)
        if local is not None:
            await stop(local)
        sockets.cleanup()


async def compare(baseline: str, repeat: int, options: list[str]) -> None:
    """This checkout against `baseline`'s (server, SDK and plugins), interleaved runs.

    Each run is this script in its own process, importing one tree's code; the
    figures are the medians over `repeat` rounds, and their ratio this / baseline.
    """
    trees = {"baseline": baseline, "this": str(HERE.parent)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(repeat):
        for name, tree in trees.items():
            env = checkout_env(tree)
            env.pop("GRPC_EXPERIMENTS", None)  # its own
            process = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--json", *options, cwd=tree, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            out, _ = await process.communicate()
            runs[name].append(json.loads(out.decode().strip().splitlines()[-1]))
    print(f"plugin A/B · baseline {baseline} · {repeat} interleaved rounds · medians")
    print(f"  {'figure':<22}{'baseline':>12}{'this':>12}{'this/base':>12}")
    for key in runs["this"][0]:
        if key not in runs["baseline"][0]:  # a figure the baseline does not measure
            this = statistics.median(run[key] for run in runs["this"])
            print(f"  {key:<22}{'-':>12}{this:>12,.2f}{'-':>12}")
            continue
        base = statistics.median(run[key] for run in runs["baseline"])
        this = statistics.median(run[key] for run in runs["this"])
        print(f"  {key:<22}{base:>12,.2f}{this:>12,.2f}{this / base if base else 0:>12.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--chunk-turns", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    parser.add_argument("--observer", action="store_true", help="measure the observer only")
    parser.add_argument("--buffer", type=int, default=0, help="the observer's buffer_size")
    parser.add_argument("--baseline", help="another checkout to compare with, interleaved")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of a --baseline comparison")
    args = parser.parse_args()
    if args.baseline:
        passed = ["--calls", str(args.calls), "--turns", str(args.turns)]
        passed += ["--chunk-turns", str(args.chunk_turns)]
        asyncio.run(compare(str(Path(args.baseline).resolve()), args.repeat, passed))
    elif args.observer:
        print("one session-event observer, in its own process (loopback)")
        asyncio.run(observer_cost(args.chunk_turns, args.buffer))
    else:
        QUIET = args.json
        asyncio.run(main(args.calls, args.turns, args.chunk_turns))
        if args.json:
            print(json.dumps(FIGURES))
