"""What the HTTP side (the console's JSON API) costs against calling gRPC directly.

One in-process server with `httpListen`, memory store. Each round times the same calls
both ways, in rotating order: `GetAgent` (unary: JSON in, a forwarded gRPC call over
the private Unix socket, JSON out) and a whole turn (SendMessage, then the session
events read off StreamSessionEvents up to the turn's end: SSE against a gRPC stream).
The figures are medians over the rounds, and the ratio HTTP / gRPC of each.

    python -m bench.http_bench [--calls N] [--turns N] [--rounds N]

Nothing here asserts a timing: the figures are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import grpc
import httpx

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_factory_service_pb2_grpc as fac_rpc
from agentloop.v1 import agent_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import agent_service_pb2_grpc as api_rpc
from server.edge.app import App
from server.settings.config import Config

JSON = {"Content-Type": "application/json"}
AGENTS = "/api/agentloop.v1.AgentService"


async def grpc_unary(stub: fac_rpc.AgentFactoryServiceAsyncStub, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await stub.GetAgent(fac.GetAgentRequest(agent_id="bench"))
    return (time.perf_counter() - started) / calls * 1e6


async def http_unary(client: httpx.AsyncClient, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        answer = await client.post(
            "/api/agentloop.v1.AgentFactoryService/GetAgent", headers=JSON,
            content='{"agentId": "bench"}',
        )  # fmt: skip
        assert answer.status_code == 200
    return (time.perf_counter() - started) / calls * 1e6


async def grpc_turns(stub: api_rpc.AgentServiceAsyncStub, turns: int) -> float:
    started = time.perf_counter()
    for _ in range(turns):
        sent = await stub.SendMessage(api.SendMessageRequest(agent_id="bench", text="a b c"))
        call = stub.StreamSessionEvents(
            api.StreamSessionEventsRequest(agent_id="bench", from_seq=sent.next_seq)
        )
        done = False
        async for batch in call:
            if any(e.WhichOneof("payload") == "turn_end" for e in batch.events):
                done = True
                break
        call.cancel()
        assert done
    return (time.perf_counter() - started) / turns * 1e6


async def http_turns(client: httpx.AsyncClient, turns: int) -> float:
    started = time.perf_counter()
    for _ in range(turns):
        sent = await client.post(
            f"{AGENTS}/SendMessage", headers=JSON, content='{"agentId": "bench", "text": "a b c"}'
        )
        body = {"agentId": "bench", "fromSeq": int(sent.json()["nextSeq"])}
        done = False
        async with client.stream(
            "POST", f"{AGENTS}/StreamSessionEvents", headers=JSON, json=body
        ) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data: ") and any(
                    "turnEnd" in e for e in json.loads(line[6:]).get("events", [])
                ):
                    done = True
                    break
        assert done
    return (time.perf_counter() - started) / turns * 1e6


async def main(calls: int, turns: int, rounds: int) -> None:
    config = Config(listen="127.0.0.1:0", http_listen="127.0.0.1:0", store="memory", agents=())
    app = App(config)
    port = await app.start()
    assert app.http is not None
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    factory = fac_rpc.AgentFactoryServiceStub(channel)
    agents = api_rpc.AgentServiceStub(channel)
    await factory.CreateAgent(
        fac.CreateAgentRequest(
            agent_id="bench", options=agent_pb2.AgentOptions(tools=["word_count"])
        )
    )
    figures: dict[str, list[float]] = {
        k: [] for k in ("grpc_unary", "http_unary", "grpc_turn", "http_turn")
    }
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{app.http.port}", timeout=30
        ) as client:
            await http_unary(client, 10)  # warm both paths up
            await grpc_unary(factory, 10)
            for round_ in range(rounds):
                order = [0, 1] if round_ % 2 == 0 else [1, 0]
                for which in order:
                    if which == 0:
                        figures["grpc_unary"].append(await grpc_unary(factory, calls))
                        figures["grpc_turn"].append(await grpc_turns(agents, turns))
                    else:
                        figures["http_unary"].append(await http_unary(client, calls))
                        figures["http_turn"].append(await http_turns(client, turns))
    finally:
        await channel.close()
        await app.stop(grace=0)
    median = {k: statistics.median(v) for k, v in figures.items()}
    print(f"HTTP side vs gRPC ({rounds} rounds of {calls} GetAgent calls and {turns} turns)")
    print(
        f"  GetAgent: gRPC {median['grpc_unary']:.0f} µs, HTTP+JSON {median['http_unary']:.0f} µs"
        f"  (ratio {median['http_unary'] / median['grpc_unary']:.2f})"
    )
    print(
        f"  turn (send + stream to turn_end): gRPC {median['grpc_turn']:.0f} µs,"
        f" HTTP+SSE {median['http_turn']:.0f} µs"
        f"  (ratio {median['http_turn'] / median['grpc_turn']:.2f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.turns, args.rounds))
