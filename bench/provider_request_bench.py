"""What a provider spends per request on a long history: the O(history) work of a request.

    python -m bench.provider_request_bench [--at 1000,3000]

One in-process conversation of the benchmark workload (four history messages a turn)
grows to each turn of `--at`; there, one model request's messages are taken as a step
takes them (a view, no copy) and, median of 5, timed in this process's CPU:
- the OpenAI adapter: translating them to Chat Completions messages
  (`openai_wire.request_body`), then encoding that body as JSON;
- a plugin model provider: building the `ModelStreamCall` of the call, then its bytes.
The bytes sent grow with the history whatever is done: each request carries it all.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import content_pb2 as c
from bench.conversation_bench import OPTIONS, PROMPT
from bench.loop_bench import line
from server.edge.app import build_runtime
from server.lifecycle.factory import AgentFactory
from server.models import ModelRequest
from server.models.openai_wire import request_body
from server.settings.config import Config


def cpu_us(fn: Callable[[], object], times: int = 5) -> float:
    """Median CPU µs of `fn()`."""
    samples = []
    for _ in range(times):
        start = time.process_time()
        fn()
        samples.append(time.process_time() - start)
    return statistics.median(samples) * 1e6


async def bench(at: list[int]) -> None:
    factory = AgentFactory(build_runtime(Config(store="memory")))
    agent = await factory.create("long", OPTIONS)
    header = c.RequestHeader(system="You are a test.")
    print("one request's messages on a long history (CPU of this process, median of 5)")
    for turn in at:
        while agent.session.max_turn < turn:
            agent.send(PROMPT)
            await agent.when_idle()
        messages = agent.session.history().behind(header.message_prefix)
        request = ModelRequest("long", "s", turn, 1, header, messages, OPTIONS)
        body = request_body(request, "m")
        wire = hk.ModelStreamCall(provider="p", header=header, messages=messages)
        print(f"at turn {turn:,}: {len(messages):,} messages")
        line("  OpenAI: translate the messages (avoidable per request)",
             f"{cpu_us(partial(request_body, request, 'm')):,.0f} µs", "")  # fmt: skip
        line("  OpenAI: encode the body as JSON (unavoidable)",
             f"{cpu_us(partial(json.dumps, body)):,.0f} µs", "")  # fmt: skip
        line("  OpenAI: body bytes", f"{len(json.dumps(body).encode()):,}", "")
        line("  plugin model: build its call (a copy of each message)",
             f"{cpu_us(partial(hk.ModelStreamCall, messages=messages)):,.0f} µs", "")  # fmt: skip
        line("  plugin model: serialize the call (unavoidable)",
             f"{cpu_us(wire.SerializeToString):,.0f} µs", "")  # fmt: skip
        line("  plugin model: call bytes", f"{wire.ByteSize():,}", "")
        line("  the list copy a step made of its history before",
             f"{cpu_us(partial(list, messages)):,.0f} µs", "")  # fmt: skip
    await factory.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--at", default="1000,3000", help="comma-separated turn numbers")
    args = parser.parse_args()
    asyncio.run(bench([int(t) for t in args.at.split(",")]))


if __name__ == "__main__":
    main()
