"""A bare grpc.aio bidi ping-pong under variants of gRPC's settings: the floor of a plugin call.

    python -m bench.pingpong_bench [--calls N] [--rounds N] [VARIANT ...]

Each variant runs an echo server and a client in processes of their own (the settings
that gRPC reads as it loads need a fresh process), alternated over the rounds; it
prints the median round trip, its ratio to the first variant's, and the CPU per round
trip of the client and of the server process (the figure a shared machine disturbs
least). Nothing is asserted. The messages are those of a plugin stream: a
`HandleRequest` with a small call out, a `HandleResponse` with its result back, written
as bytes.

`default` is gRPC as it loads with no setting; `polled` is what the server and the
plugin helper choose (`agentloop.plugin.polling`); the others try one setting each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypedDict

from agentloop.plugin.polling import CLIENT, LISTENER

METHOD = "/agentloop.plugin.v1.HookService/Handle"
BASE_OPTIONS = [("grpc.enable_retries", 0)]  # as the server's plugin channels
POLLED = f"{CLIENT},{LISTENER}"


class Variant(TypedDict, total=False):
    client: list[tuple[str, Any]]
    """Channel options."""
    server: list[tuple[str, Any]]
    """Server options."""
    env: dict[str, str]
    """`GRPC_EXPERIMENTS` and the like, for both processes."""
    unix: bool
    """A Unix domain socket instead of loopback TCP."""
    serve: str
    """How the echo answers: `write` (context.write, as the helper), `yield`, `read`."""
    read: str
    """How the client reads: `read` (stream.read(), as the server) or `iterate`."""


def both(*options: tuple[str, Any]) -> Variant:
    return {"client": list(options), "server": list(options)}


VARIANTS: dict[str, Variant] = {
    "default": {},
    "polled": {"env": {"GRPC_EXPERIMENTS": POLLED}},
    "polled-client": {"env": {"GRPC_EXPERIMENTS": CLIENT}},
    "polled-listener": {"env": {"GRPC_EXPERIMENTS": LISTENER}},
    "bdp-probe-off": both(("grpc.http2.bdp_probe", 0)),
    "no-pings": {
        "client": [("grpc.http2.max_pings_without_data", 0), ("grpc.keepalive_time_ms", 2**31 - 1)],
        "server": [("grpc.http2.max_pings_without_data", 0)],
    },
    "latency-target": both(("grpc.optimization_target", "latency")),
    "write-buffer-0": both(("grpc.http2.write_buffer_size", 0)),
    "write-buffer-1m": both(("grpc.http2.write_buffer_size", 1 << 20)),
    "min-read-4k": both(("grpc.experimental.tcp_min_read_chunk_size", 4096)),
    "unix": {"unix": True},
    "unix-polled": {"unix": True, "env": {"GRPC_EXPERIMENTS": POLLED}},
    "echo-yields": {"serve": "yield"},
    "echo-reads": {"serve": "read"},
    "client-iterates": {"read": "iterate"},
    "polled-echo-reads": {"serve": "read", "env": {"GRPC_EXPERIMENTS": POLLED}},
}


async def serve(address: str, name: str) -> None:
    import grpc

    from agentloop.plugin.v1 import hook_service_pb2 as hk

    variant = VARIANTS[name]
    style = variant.get("serve", "write")
    server = grpc.aio.server(options=variant.get("server", []))

    def answer(request: hk.HandleRequest) -> bytes:
        result = hk.HookResult(call_id=request.call.call_id)
        return hk.HandleResponse(result=result).SerializeToString()

    async def written(requests: AsyncIterator[hk.HandleRequest], context: Any) -> None:
        await context.send_initial_metadata(())
        if style == "read":
            while (request := await context.read()) is not grpc.aio.EOF:
                await context.write(answer(request))
            return
        async for request in requests:
            await context.write(answer(request))

    async def yielded(requests: AsyncIterator[hk.HandleRequest], context: Any) -> Any:
        async for request in requests:
            yield answer(request)

    handler: Any = grpc.stream_stream_rpc_method_handler(
        yielded if style == "yield" else written,
        request_deserializer=hk.HandleRequest.FromString,
        response_serializer=None,
    )
    service = grpc.method_handlers_generic_handler(
        "agentloop.plugin.v1.HookService", {"Handle": handler}
    )
    server.add_generic_rpc_handlers((service,))
    port = server.add_insecure_port(address)
    await server.start()
    print(address if address.startswith("unix:") else f"127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


async def client(address: str, name: str, calls: int) -> None:
    """Prints the median round trip (µs) and this process's CPU per round trip (µs)."""
    import grpc

    from agentloop.plugin.v1 import hook_service_pb2 as hk

    variant = VARIANTS[name]
    options = BASE_OPTIONS + variant.get("client", [])
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        handle: Any = channel.stream_stream(
            METHOD, request_serializer=None, response_deserializer=hk.HandleResponse.FromString
        )
        stream = handle()
        await stream.wait_for_connection()
        responses = stream.__aiter__() if variant.get("read") == "iterate" else None
        samples = []
        warm = 200
        cpu = time.process_time()
        for i in range(calls + warm):
            if i == warm:
                cpu = time.process_time()
            call = hk.HookCall(call_id=f"c{i}", seam=hk.SEAM_TURN_STOP, turn_stop=hk.TurnStopCall())
            request = hk.HandleRequest(call=call).SerializeToString()
            started = time.perf_counter()
            await stream.write(request)
            await (responses.__anext__() if responses is not None else stream.read())
            if i >= warm:
                samples.append((time.perf_counter() - started) * 1e6)
        used = (time.process_time() - cpu) / calls * 1e6
        stream.cancel()
    print(statistics.median(samples), used, flush=True)


def environment(name: str) -> dict[str, str]:
    """The variant's environment: no gRPC experiments but its own."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    return {**env, **VARIANTS[name].get("env", {})}


async def run(names: list[str], calls: int, rounds: int, scratch: Path) -> None:
    from bench.common import cpu_seconds  # here: the children run as scripts, off the path

    servers: dict[str, tuple[asyncio.subprocess.Process, str]] = {}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    try:
        for name in names:
            address = f"unix:{scratch / name}.sock" if VARIANTS[name].get("unix") else "127.0.0.1:0"
            process = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--serve", address, name,
                stdout=asyncio.subprocess.PIPE, env=environment(name),
            )  # fmt: skip
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 10)
            servers[name] = (process, line.decode().strip())
        for _ in range(rounds):  # alternated: the machine may be shared
            for name in names:
                process, address = servers[name]
                before = cpu_seconds(process.pid)
                child = await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--client", address, name, "--calls", str(calls),
                    stdout=asyncio.subprocess.PIPE, env=environment(name),
                )  # fmt: skip
                out, _ = await child.communicate()
                median, client_cpu = map(float, out.decode().split())
                server_cpu = (cpu_seconds(process.pid) - before) / calls * 1e6
                results[name].append((median, client_cpu, server_cpu))
    finally:
        for process, _ in servers.values():
            process.terminate()
            await process.wait()
    figures = {
        name: [statistics.median(r[i] for r in results[name]) for i in range(3)] for name in names
    }
    first = figures[names[0]]
    print(f"bidi ping-pong · {calls} round trips × {rounds} alternated rounds · medians")
    print(
        f"  {'variant':<18}{'round trip':>12}{'ratio':>8}{'client CPU':>12}{'ratio':>8}"
        f"{'server CPU':>12}{'ratio':>8}"
    )
    for name, (median, client_cpu, server_cpu) in figures.items():
        print(
            f"  {name:<18}{median:>9,.0f} µs{median / first[0]:>7.2f}×"
            f"{client_cpu:>9,.0f} µs{client_cpu / first[1]:>7.2f}×"
            f"{server_cpu:>9,.0f} µs{server_cpu / first[2]:>7.2f}×"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("variants", nargs="*", help=f"default: all ({', '.join(VARIANTS)})")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", nargs=2, metavar=("ADDRESS", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=2, metavar=("ADDRESS", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(*args.serve))
    elif args.client:
        address, name = args.client
        asyncio.run(client(address, name, args.calls))
    else:
        unknown = [name for name in args.variants if name not in VARIANTS]
        if unknown:
            parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
        import tempfile

        with tempfile.TemporaryDirectory(prefix="pingpong") as scratch:
            asyncio.run(
                run(args.variants or list(VARIANTS), args.calls, args.rounds, Path(scratch))
            )
