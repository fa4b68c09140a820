"""The floor of the gRPC edge on this machine: what grpc.aio itself costs the server.

    python -m bench.grpc_floor [--calls N]

A server process with generic bytes-in, bytes-out handlers (no protobuf, no
interceptor, no agentloop code) on asyncio's loop; the client in this process, one
channel. Measured one after another, each for N rounds, as server CPU µs per round
(from /proc) and the client's wall time per round (median):
- a bare unary call;
- a server-stream message: the client calls a unary "poke", the server wakes a
  stream it holds open, which sends one message the client reads (the shape of a
  SendMessage and the turn's events on StreamSessionEvents);
- the same with two stream messages per poke.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from bench.common import cpu_seconds, free_port, line

SERVICE = "floor.Floor"


def ident(raw: bytes) -> bytes:
    return raw


async def serve(address: str) -> None:
    """The server: Unary echoes; Poke wakes Stream, which yields `count` messages per poke."""
    pokes: asyncio.Queue[int] = asyncio.Queue()

    async def unary(request: bytes, context: Any) -> bytes:
        return request

    async def poke(request: bytes, context: Any) -> bytes:
        pokes.put_nowait(int(request or b"1"))
        return b""

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        while True:
            count = await pokes.get()
            for _ in range(count):
                yield b"x" * 64

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, ident, ident),
        "Poke": grpc.unary_unary_rpc_method_handler(poke, ident, ident),
        "Stream": grpc.unary_stream_rpc_method_handler(stream, ident, ident),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(address)
    await server.start()
    print("listening", flush=True)
    await server.wait_for_termination()


async def measure(pid: int, address: str, calls: int) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    async with grpc.aio.insecure_channel(address) as channel:
        unary = channel.unary_unary(f"/{SERVICE}/Unary", ident, ident)
        poke = channel.unary_unary(f"/{SERVICE}/Poke", ident, ident)
        stream = channel.unary_stream(f"/{SERVICE}/Stream", ident, ident)

        async def rounds(name: str, one: Any) -> None:
            for _ in range(200):  # warm-up
                await one()
            walls = []
            cpu = cpu_seconds(pid)
            for _ in range(calls):
                started = time.perf_counter()
                await one()
                walls.append(time.perf_counter() - started)
            out[name] = ((cpu_seconds(pid) - cpu) / calls * 1e6, statistics.median(walls) * 1e6)

        await rounds("unary", lambda: unary(b"ping"))
        call = stream(b"")
        reader = call.__aiter__()

        async def poke_read(count: int) -> None:
            await poke(str(count).encode())
            for _ in range(count):
                await reader.__anext__()

        await rounds("unary + 1 stream message", lambda: poke_read(1))
        await rounds("unary + 2 stream messages", lambda: poke_read(2))
        call.cancel()
    return out


async def bench(calls: int) -> None:
    address = f"127.0.0.1:{free_port()}"
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.grpc_floor", "--serve", address,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert server.stdout is not None
    await server.stdout.readline()
    try:
        results = await measure(server.pid, address, calls)
    finally:
        server.terminate()
        await server.wait()
    print(f"grpc.aio floor · grpcio {grpc.__version__} · {os.cpu_count()} cores · {calls} rounds")
    for name, (cpu, wall) in results.items():
        line(f"{name}: server CPU / client wall (median)", f"{cpu:,.0f} / {wall:,.0f} µs", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--serve", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
    else:
        asyncio.run(bench(args.calls))


if __name__ == "__main__":
    main()
