"""A resume of a 100k-event session with compactions against one without; a turn's cost.

    python -m bench.compaction_bench [--events 100000] [--turns 2000] [--baseline DIR]
                                     [--repeat 1]

Two in-process agents of the benchmark workload (the scripted model, the word_count
tool, the SQLite store in a temporary directory) grow to `--events` events each: one
with a small window (`WINDOW` tokens), which compacts on its own every few turns, and
one whose window is unknown, which never compacts. Each is then disposed and resumed,
`SAMPLES` times: printed (medians) the resume's wall time and its longest stretch of
the event loop, the events the resume replayed (from its replay point on), and the
growth of the process's resident memory over a resume, at its peak and after it (in a
run of its own). Then a fresh agent that never compacts runs `--turns`
turns: the median turn's wall time, the figure a change of the compaction code must
leave unchanged. With `--baseline`, checkout DIR runs the same in its own process,
`--repeat` rounds each, medians side by side, and the turn's ratio this ÷ baseline.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from typing import Any

from bench.common import checkouts, loop_probe, medians

SAMPLES = 3
WINDOW = 2048
"""The compacting agent's window, in tokens: a compaction every few dozen turns."""


async def timed_resume(factory: Any, agent_id: str, session_id: str) -> tuple[float, float, Any]:
    """(wall s, longest loop stretch s, the agent) of one resume, a probe beside it."""
    running = asyncio.Event()
    running.set()
    probe = asyncio.create_task(loop_probe(running))
    await asyncio.sleep(0)
    start = time.perf_counter()
    agent = await factory.resume(agent_id, session_id, None)
    wall = time.perf_counter() - start
    running.clear()
    return wall, await probe, agent


def status(field: str) -> float:
    """A field of /proc/self/status, in MB (Linux)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(f"{field}:"))
    return int(line.split()[1]) / 1024


def reset_peak() -> None:
    """Reset the kernel's high-water mark of this process's resident set (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


async def measured_resume(factory: Any, agent_id: str, session_id: str) -> tuple[float, float]:
    """(peak MB, kept MB) of the process's resident set over one resume.

    The peak is the kernel's high-water mark, reset first (`clear_refs` 5): it counts the
    protobuf runtime's own allocations, which tracemalloc does not see.
    """
    reset_peak()
    before = status("VmRSS")
    await factory.resume(agent_id, session_id, None)
    return status("VmHWM") - before, status("VmRSS") - before


async def grow(agent: Any, events: int) -> None:
    from bench.common import PROMPT

    while len(agent.session) < events:
        agent.send(PROMPT)
        await agent.when_idle()


async def measure(events: int, turns: int) -> dict[str, float]:
    """The figures of the checkout this process imports."""
    from bench.common import OPTIONS, PROMPT
    from server.lifecycle.factory import AgentFactory
    from server.lifecycle.runtime import build_runtime
    from server.memory import freeze_startup_heap
    from server.settings.config import Config

    freeze_startup_heap()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as data_dir:
        runtime = build_runtime(Config(store="sqlite", data_dir=data_dir))
        factory = AgentFactory(runtime)
        small = type(OPTIONS)()
        small.CopyFrom(OPTIONS)
        small.context_window_tokens = WINDOW
        for name, options in (("compacting", small), ("whole", OPTIONS)):
            agent = await factory.create(name, options)
            session_id = agent.session.session_id
            await grow(agent, events)
            out[f"events {name}"] = len(agent.session)
            summaries = 0
            for event in await agent.session.read(1, len(agent.session) + 1):
                summaries += event.context_message.HasField("compaction")
            out[f"compactions {name}"] = summaries
            walls, stretches = [], []
            for _ in range(SAMPLES):
                await factory.dispose(name)
                wall, longest, agent = await timed_resume(factory, name, session_id)
                walls.append(wall)
                stretches.append(longest)
            replayed = len(agent.session) + 1 - getattr(agent.session, "first_seq", 1)
            out[f"replayed {name}"] = replayed
            out[f"wall {name}"] = statistics.median(walls) * 1e3
            out[f"stretch {name}"] = statistics.median(stretches) * 1e3
            await factory.dispose(name)
            peak, kept = await measured_resume(factory, name, session_id)
            out[f"peak {name}"] = peak
            out[f"kept {name}"] = kept
            await factory.dispose(name)
        turner = await factory.create("turns", OPTIONS)
        times = []
        for _ in range(turns):
            start = time.perf_counter()
            turner.send(PROMPT)
            await turner.when_idle()
            times.append(time.perf_counter() - start)
        out["turn"] = statistics.median(times) * 1e6
        await factory.close()
        await runtime.store.close()
    return out


def report(events: int, turns: int, baseline: str, repeat: int) -> None:
    trees = checkouts(baseline)
    med = medians(__file__, trees, ["--events", str(events), "--turns", str(turns)], repeat)
    against = f"; baseline {baseline}" if baseline else ""
    print(f"a resume of a {events:,}-event session (SQLite store), median of {SAMPLES}, then of"
          f" {repeat} process(es){against}")  # fmt: skip
    heading = "".join(f"{who:>14}" for who in reversed(trees))
    rows = (
        ("events", "events", ",.0f"),
        ("compactions", "compactions in it", ",.0f"),
        ("replayed", "events the resume replayed", ",.0f"),
        ("wall", "the resume: wall ms", ",.1f"),
        ("stretch", "the resume: longest stretch ms", ",.1f"),
        ("peak", "the resume: peak RSS growth MB", ",.1f"),
        ("kept", "the resume: RSS growth kept MB", ",.1f"),
    )
    for name, title in (("compacting", "with compactions"), ("whole", "without compactions")):
        print(f"  {title:<40}{heading}")
        for key, label, fmt in rows:
            row = "".join(f"{med[who][f'{key} {name}']:>14{fmt}}" for who in reversed(trees))
            print(f"    {label:<38}{row}")
    row = "".join(f"{med[who]['turn']:>14,.1f}" for who in reversed(trees))
    print(f"  {'a turn that does not compact: µs (median)':<42}{row}")
    if baseline:
        ratio = med["this"]["turn"] / med["baseline"]["turn"]
        print(f"  {'its ratio, this ÷ baseline':<42}{ratio:>14.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="events of each session")
    parser.add_argument("--turns", type=int, default=2000, help="turns timed without compaction")
    parser.add_argument("--baseline", default="", help="another checkout to compare with")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (each a fresh process)")
    parser.add_argument("--worker", action="store_true", help="one run; print JSON")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(measure(args.events, args.turns))))
        return
    report(args.events, args.turns, args.baseline, args.repeat)


if __name__ == "__main__":
    main()
