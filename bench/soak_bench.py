"""A soak: many clients, one agent each, against a real server on a temporary SQLite store.

    python -m bench.soak_bench [--clients N] [--seconds S] [--store sqlite|memory]

Each client creates an agent, follows its session on one stream (the SDK's
`Client.conversation`) and sends messages one after another (each waits for the turn
that answers it, or for the message to show as dropped), now and then steering or
cancelling. A separate prober process calls the
health check every 20 ms: its slowest answer bounds the server's longest event-loop
stall. The server's RSS and CPU time are sampled from /proc once a second; at the
end every agent is disposed and the RSS is sampled again. Figures are printed next
to their targets; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop import client as sdk
from agentloop.v1 import agent_pb2
from bench.common import cpu_seconds, free_port, line, rss_mb

OPTIONS = agent_pb2.AgentOptions(provider="scripted", model="soak", tools=["word_count"])

PROBER = """
import asyncio, sys, time, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
async def main(address):
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        start = time.monotonic()
        while True:
            t = time.perf_counter()
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
            print(f"{time.monotonic() - start:.2f} {time.perf_counter() - t:.4f}", flush=True)
            await asyncio.sleep(0.02)
asyncio.run(main(sys.argv[1]))
"""


class Client:
    """One agent, one stream, messages in a loop."""

    def __init__(self, client: sdk.Client, agent_id: str, rng: random.Random) -> None:
        self.client = client
        self.agent_id = agent_id
        self.rng = rng
        self.latencies: list[float] = []

    async def run(self, until: float) -> None:
        await self.client.create(self.agent_id, OPTIONS)
        async with self.client.conversation(self.agent_id) as chat:
            while time.monotonic() < until:
                sent = time.perf_counter()
                turn = await chat.send("count these words")
                roll = self.rng.random()
                if roll < 0.1:
                    await self.client.steer(self.agent_id, "and these")
                elif roll < 0.15:
                    await self.client.cancel(self.agent_id)
                await turn.result()  # its turn_end, or its message_dropped after a cancel
                self.latencies.append(time.perf_counter() - sent)

    async def dispose(self) -> None:
        await self.client.dispose(self.agent_id)


async def soak(clients: int, seconds: float, store: str) -> None:
    data_dir = tempfile.mkdtemp(prefix="agentloop-soak-")
    port = free_port()
    address = f"127.0.0.1:{port}"
    config = Path(data_dir) / "config.yaml"
    config.write_text(f"agents: []\nstore: {store}\n")
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", "--config", str(config), "--listen", address,
        "--data-dir", data_dir, "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert server.stdout is not None
    await server.stdout.readline()
    prober = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROBER, address, stdout=asyncio.subprocess.PIPE
    )
    try:
        start_rss = rss_mb(server.pid)
        samples: list[tuple[float, float]] = []
        client = sdk.connect(address)
        async with client.channel as channel:
            health: Any = health_pb2_grpc.HealthStub(channel)  # the typeshed stub has no methods
            await health.Check(health_pb2.HealthCheckRequest())
            rng = random.Random(7)
            crowd = [
                Client(client, f"soak-{i}", random.Random(rng.random())) for i in range(clients)
            ]
            began = time.monotonic()
            cpu_before = cpu_seconds(server.pid)
            tasks = [asyncio.ensure_future(c.run(began + seconds)) for c in crowd]
            while not all(t.done() for t in tasks):
                await asyncio.sleep(1)
                samples.append((time.monotonic() - began, rss_mb(server.pid)))
            await asyncio.gather(*tasks)
            cpu = cpu_seconds(server.pid) - cpu_before
            elapsed = time.monotonic() - began
            await asyncio.gather(*(c.dispose() for c in crowd))
            await asyncio.sleep(2)
            after_dispose = rss_mb(server.pid)
        prober.terminate()
        out, _ = await prober.communicate()
        checks = [tuple(map(float, row.split())) for row in out.decode().splitlines() if row]
        during = [took for at, took in checks if at <= elapsed]
        worst_health = max(during)
        worst_after = max((took for at, took in checks if at > elapsed), default=0.0)
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 30)
        if prober.returncode is None:
            prober.kill()
    latencies = sorted(x for c in crowd for x in c.latencies)
    turns = len(latencies)
    warm = [rss for t, rss in samples if t >= min(10.0, seconds / 3)]
    print(f"soak: {clients} clients, {elapsed:.0f} s, store {store} (server in a subprocess)")
    line("turns completed", f"{turns:,}", "")
    line("turns per second", f"{turns / elapsed:,.0f}", "")
    line("server CPU per turn", f"{cpu / turns * 1e6:,.0f} µs", "")
    line("SendMessage → turn_end p50", f"{statistics.median(latencies) * 1e3:,.0f} ms", "")
    p99 = latencies[int(0.99 * (turns - 1))]
    line("SendMessage → turn_end p99", f"{p99 * 1e3:,.0f} ms", "")
    line("longest health check under load (bounds a loop stall)", f"{worst_health * 1e3:,.0f} ms",
         "≤ 50 ms")  # fmt: skip
    line("longest health check while disposing every agent", f"{worst_after * 1e3:,.0f} ms", "")
    line("RSS at start", f"{start_rss:,.1f} MB", "")
    line("RSS after warm-up: min / max", f"{min(warm):,.0f} / {max(warm):,.0f} MB",
         "flat within 50 MB")  # fmt: skip
    line("RSS after disposing every agent", f"{after_dispose:,.1f} MB",
         f"within 30 MB of {start_rss:,.0f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    args = parser.parse_args()
    asyncio.run(soak(args.clients, args.seconds, args.store))


if __name__ == "__main__":
    main()
