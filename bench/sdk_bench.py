"""What the Python SDK's facade costs per turn, against raw stubs, on one server.

    python -m bench.sdk_bench [--turns N] [--rounds R]

One server process (SQLite in a temporary directory). Each round runs three clients
of the benchmark turn, one agent each, in a rotating order: raw stubs reading one
`StreamSessionEvents` call until a batch holds a `turn_end` (what the benchmarks did
before the facade); the same with a `request_id` on each `SendMessage` (the facade
always sends one, and the server records it); and the facade, `Client.conversation`
(one stream, each send's answering turn read to its end). Printed: medians over the
rounds of wall time, client CPU time and server CPU time per turn, stream responses
per turn, and the facade's ratios to raw stubs with a request id. CPU time is the
figure to read on a shared machine: wall time there is mostly other processes.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from agentloop.client import Client, connect
from agentloop.v1 import agent_service_pb2 as api
from bench.common import OPTIONS, cpu_seconds, free_port, line

ROOT = str(Path(__file__).resolve().parent.parent)

Figures = tuple[float, float, float, float]
"""Per turn: wall µs, client CPU µs, server CPU µs, stream responses."""


async def measure(
    pid: int, turns: int, turn: Callable[[], Awaitable[None]], responses: Callable[[], int]
) -> Figures:
    for _ in range(20):
        await turn()
    read = responses()
    wall, cpu, server = time.perf_counter(), time.process_time(), cpu_seconds(pid)
    for _ in range(turns):
        await turn()
    return (
        (time.perf_counter() - wall) / turns * 1e6,
        (time.process_time() - cpu) / turns * 1e6,
        (cpu_seconds(pid) - server) / turns * 1e6,
        (responses() - read) / turns,
    )


async def raw(client: Client, pid: int, agent_id: str, turns: int, request_ids: bool) -> Figures:
    await client.create(agent_id, OPTIONS)
    agents = client.agents
    stream = agents.StreamSessionEvents(api.StreamSessionEventsRequest(agent_id=agent_id))
    reader = stream.__aiter__()
    read = [0]

    async def turn() -> None:
        request_id = str(uuid.uuid4()) if request_ids else ""
        await agents.SendMessage(
            api.SendMessageRequest(agent_id=agent_id, text="count me", request_id=request_id)
        )
        while True:
            batch = await reader.__anext__()
            read[0] += 1
            if any(event.HasField("turn_end") for event in batch.events):
                return

    try:
        return await measure(pid, turns, turn, lambda: read[0])
    finally:
        stream.cancel()
        await client.dispose(agent_id)


async def facade(client: Client, pid: int, agent_id: str, turns: int) -> Figures:
    await client.create(agent_id, OPTIONS)
    async with client.conversation(agent_id) as chat:

        async def turn() -> None:
            await (await chat.send("count me")).result()

        figures = await measure(pid, turns, turn, lambda: chat.stream.batches_read)
    await client.dispose(agent_id)
    return figures


async def bench(turns: int, rounds: int) -> None:
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="agentloop-sdk-bench-")
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir,
        "--log-level", "WARNING", stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        await server.stdout.readline()  # "agentloop listening on ..."
        client = connect(f"127.0.0.1:{port}")
        pid = server.pid
        clients: list[tuple[str, Callable[[str], Awaitable[Figures]]]] = [
            ("raw stubs", lambda a: raw(client, pid, a, turns, request_ids=False)),
            ("raw stubs + request_id", lambda a: raw(client, pid, a, turns, request_ids=True)),
            ("facade (Client.conversation)", lambda a: facade(client, pid, a, turns)),
        ]
        results: dict[str, list[Figures]] = {name: [] for name, _ in clients}
        for r in range(rounds):
            for i, (name, run) in enumerate(clients[r % 3 :] + clients[: r % 3]):
                results[name].append(await run(f"sdk-{r}-{i}"))
        await client.close()
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)
        shutil.rmtree(data_dir, ignore_errors=True)
    medians = {
        name: [statistics.median(f[k] for f in figures) for k in range(4)]
        for name, figures in results.items()
    }
    print(f"SDK facade against raw stubs · one server · {rounds} rounds of {turns} turns, medians")
    for name, (wall, cpu, server_cpu, responses) in medians.items():
        print(name)
        line("  wall / client CPU / server CPU per turn",
             f"{wall:,.0f} / {cpu:,.0f} / {server_cpu:,.0f} µs", "")  # fmt: skip
        line("  stream responses per turn", f"{responses:.2f}", "")
    pairs = list(
        zip(results["raw stubs + request_id"], results["facade (Client.conversation)"], strict=True)
    )
    for k, what in ((1, "client CPU"), (2, "server CPU"), (0, "wall")):
        ratio = statistics.median(sdk[k] / base[k] for base, sdk in pairs)
        line(f"facade / raw + request_id, {what} (per round)", f"{ratio:.2f}×", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    asyncio.run(bench(args.turns, args.rounds))


if __name__ == "__main__":
    main()
