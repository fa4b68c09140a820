"""The benchmark workload on other agent frameworks, each in a worker of its own.

A peer's worker runs under the interpreter that has the peer installed (`make peers`
makes `.venv-peers`); it imports nothing of agentloop, only the standard library, the
peer and this module, and prints its figures as one JSON object on its last line.

Every peer runs the same conversation as agentloop's in-process turn: a user prompt,
a model that asks for one tool call (`word_count`, an async tool), the tool, the model
answering with a short text; the next turn carries the whole history so far. Each
peer's model is scripted in the peer's own model interface, as agentloop's scripted
model is in its own: no network, no provider client.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import time
from collections.abc import Awaitable, Callable

PROMPT = "count the words of this short prompt"
"""The user's text of every turn (agentloop's `bench.common.PROMPT`)."""


def word_count(text: str) -> str:
    """The tool: as agentloop's built-in `word_count`."""
    return f"{len(text.split())} words"


def answer(tool_output: str) -> str:
    """The model's text once the tool answered: as agentloop's scripted model says it."""
    return f"Tool results: {tool_output}"


Turn = Callable[[], Awaitable[None]]
"""One turn of a conversation, to its end."""


def conversation(
    new: Callable[[], Awaitable[Turn]], turns: int, window: int, warm: int = 10
) -> dict[str, float]:
    """`warm` turns of one conversation, then `turns` turns of another, timed.

    `new()` starts a conversation (untimed) and gives its turn.

    The medians of the measured conversation's first and last `window` turns (medians:
    another process taking the core for a moment moves nothing) and the process's peak
    RSS at the end. CPU is this process's, every thread. The warm-up's conversation
    takes the first calls' costs (imports, caches) away from the measured one.
    """

    async def run() -> tuple[list[float], list[float]]:
        warm_turn = await new()
        for _ in range(warm):
            await warm_turn()
        gc.collect()
        turn = await new()
        walls: list[float] = []
        cpus: list[float] = []
        for _ in range(turns):
            wall, cpu = time.perf_counter(), time.process_time()
            await turn()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        return walls, cpus

    walls, cpus = asyncio.run(run())
    return {
        "first_us": statistics.median(walls[:window]) * 1e6,
        "first_cpu_us": statistics.median(cpus[:window]) * 1e6,
        "last_us": statistics.median(walls[-window:]) * 1e6,
        "last_cpu_us": statistics.median(cpus[-window:]) * 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def report(figures: dict[str, float]) -> None:
    """A worker's last line."""
    print(json.dumps(figures))


def run_worker(doc: str, new: Callable[[], Awaitable[Turn]]) -> None:
    """A peer worker's command line (`--turns`, `--window`): its conversation, reported."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--window", type=int, default=50)
    args = parser.parse_args()
    report(conversation(new, args.turns, args.window))
