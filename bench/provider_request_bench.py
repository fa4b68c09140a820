"""What a provider spends per request on a long history, this checkout against another.

    python -m bench.provider_request_bench [--at 1000,3000] [--baseline DIR] [--repeat 1]

One in-process conversation of the benchmark workload (four history messages a turn:
the prompt, a tool call, its result, a text; two model requests) grows to each turn of
`--at`; there, one model request's messages are taken as a step takes them (a view) and
the CPU of this process is timed (median of 5) for what each adapter does with them
before the first byte leaves (as a turn makes the request, in slices where the checkout
slices a long backlog: run to its end at once for this figure):
- the OpenAI adapter: the request's body bytes (the messages translated to Chat
  Completions messages, the body encoded as JSON);
- a plugin model provider: the `HandleRequest` bytes of its `model_stream` call.

Where the adapter keeps the agent's history encoded between requests, a request is
timed after the agent's previous one (two messages fewer: the last answer and the new
prompt), as it comes in a conversation: "per request"; "first request" is one with
nothing kept (a new agent instance, a resumed or compacted history). Where it keeps
nothing, both are the same. "longest stretch" is the event loop's: a first request
made as the adapter makes it in a turn (in slices where the checkout slices it), with
a probe task beside it timing (wall clock, µs, median of 5) the longest time between
two of its turns on the loop: what every other agent would wait at most. With
`--baseline`, checkout DIR runs the same in its own process (this file, on DIR's
server), `--repeat` rounds each, medians printed side by side. The bytes sent grow
with the history whatever is done: each request carries it all. Figures are printed, never asserted.

Runs as a script (`python bench/provider_request_bench.py --worker`), with a checkout
first on PYTHONPATH (`bench.common.worker`): that checkout's server and SDK, this `bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import checkouts, loop_probe, medians

SAMPLES = 5


async def longest_stretch_us(setup: Callable[[], object], work: Callable[[Any], Any]) -> float:
    """Median over samples of the longest wall µs the loop spent without the probe running.

    `work(setup())` returns an awaitable (a request made in slices) or the result itself
    (a request made at once).
    """
    samples = []
    for _ in range(SAMPLES):
        state = setup()
        running = asyncio.Event()
        running.set()
        task = asyncio.create_task(loop_probe(running))
        await asyncio.sleep(0)  # the probe is waiting for its next turn
        done = work(state)
        if inspect.isawaitable(done):
            await done
        running.clear()
        samples.append(await task)
    return statistics.median(samples) * 1e6


def _to_the_end(work: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`work` as a plain call: a coroutine it returns is run to its end here, without a
    loop (its only suspensions are `asyncio.sleep(0)`, which a bare `send` resumes)."""

    def run(state: Any) -> Any:
        done = work(state)
        if not inspect.iscoroutine(done):
            return done
        try:
            while True:
                done.send(None)
        except StopIteration as stop:
            return stop.value

    return run


def cpu_us(setup: Callable[[], object], timed: Callable[[Any], object]) -> float:
    """Median CPU µs of `timed(setup())`, the setup untimed."""
    samples = []
    for _ in range(SAMPLES):
        state = setup()
        start = time.process_time()
        timed(state)
        samples.append(time.process_time() - start)
    return statistics.median(samples) * 1e6


async def measure(at: list[int]) -> dict[str, float]:
    """The figures of the checkout this process imports."""
    from agentloop.v1 import content_pb2 as c
    from bench.common import OPTIONS, PROMPT
    from server.lifecycle.factory import AgentFactory

    try:
        from server.lifecycle.runtime import build_runtime
    except ImportError:  # a checkout from before the runtime moved to lifecycle
        from server.edge.app import build_runtime  # type: ignore[attr-defined]
    from server.settings.config import Config

    factory = AgentFactory(build_runtime(Config(store="memory")))
    agent = await factory.create("long", OPTIONS)
    header = c.RequestHeader(system="You are a test.")
    out: dict[str, float] = {}
    for turn in at:
        while agent.session.max_turn < turn:
            agent.send(PROMPT)
            await agent.when_idle()
        view = agent.session.history().behind(header.message_prefix)
        out |= await figures_at(turn, view, header)
    await factory.close()
    return out


async def figures_at(turn: int, view: Any, header: Any) -> dict[str, float]:
    """The figures of one request of `view`'s messages (a step's view of the history)."""
    from agentloop.plugin.v1 import hook_service_pb2 as hk
    from bench.common import OPTIONS
    from server.models import ModelRequest
    from server.plugins import wire

    request = ModelRequest("long", "s", turn, 1, header, view, OPTIONS)

    def plugin_call(messages: Any = ()) -> Any:
        return hk.HookCall(
            call_id="m1", kind=hk.CALL_KIND_MODEL_STREAM, agent_id="long", session_id="s",
            turn=turn, step=1,
            model_stream=hk.ModelStreamCall(provider="p", header=header, messages=messages),
        )  # fmt: skip

    out: dict[str, float] = {"messages": len(view)}
    try:
        from server.kernel.history import MessageView
        from server.models.openai_body import ChatHistory, request_bytes
        from server.plugins.model import EncodedMessages
    except ImportError:  # a checkout that keeps nothing between requests
        from server.models.openai_wire import request_body

        def openai(_: object) -> bytes:
            return json.dumps(request_body(request, "m")).encode()

        def plugin(_: object) -> bytes:
            return wire.call_request(plugin_call(view).SerializeToString())

        out["kept"] = False
        for name, timed in (("openai", openai), ("plugin", plugin)):
            out[f"{name} per request"] = out[f"{name} first request"] = cpu_us(dict, timed)
            out[f"{name} longest stretch"] = await longest_stretch_us(dict, timed)
        out["openai bytes"], out["plugin bytes"] = len(openai(None)), len(plugin(None))
        return {f"{key}@{turn}": value for key, value in out.items()}

    prefix, items, length = view.split()
    before = MessageView(items, length - 2, prefix)  # the agent's previous request
    earlier = ModelRequest("long", "s", turn, 1, header, before, OPTIONS)

    def openai_kept(previous: bool) -> Callable[[], object]:
        def setup() -> object:
            history = ChatHistory()
            if previous:
                request_bytes(earlier, "m", "auto", history)
            return history

        return setup

    def plugin_kept(previous: bool) -> Callable[[], object]:
        def setup() -> object:
            history = EncodedMessages()
            if previous:
                history.entries(before)
            return history

        return setup

    def openai_kept_request(history: Any) -> bytes:
        return request_bytes(request, "m", "auto", history)

    def plugin_kept_request(history: Any) -> bytes:
        return wire.model_stream_request(plugin_call(), history.entries(view))

    # As a turn makes them: in slices where this checkout slices a long backlog.
    in_turn: dict[str, Callable[[Any], Any]] = {
        "openai": openai_kept_request,
        "plugin": plugin_kept_request,
    }
    try:
        from server.kernel.abort import AbortSignal
        from server.models.openai_body import request_bytes_in_slices
    except ImportError:  # a checkout that encodes a request at once
        pass
    else:

        async def openai_in_turn(history: Any) -> bytes:
            return await request_bytes_in_slices(request, "m", "auto", history, AbortSignal())

        async def plugin_in_turn(history: Any) -> bytes:
            entries = await history.entries_in_slices(view, AbortSignal())
            return wire.model_stream_request(plugin_call(), entries)

        in_turn = {"openai": openai_in_turn, "plugin": plugin_in_turn}

    out["kept"] = True
    for name, setups in (("openai", openai_kept), ("plugin", plugin_kept)):
        # CPU: the path a turn takes (the same bytes), run to its end without the loop.
        as_in_turn = _to_the_end(in_turn[name])
        out[f"{name} per request"] = cpu_us(setups(True), as_in_turn)
        out[f"{name} first request"] = cpu_us(setups(False), as_in_turn)
        out[f"{name} longest stretch"] = await longest_stretch_us(setups(False), in_turn[name])
    out["openai bytes"] = len(openai_kept_request(ChatHistory()))
    out["plugin bytes"] = len(plugin_kept_request(EncodedMessages()))
    return {f"{key}@{turn}": value for key, value in out.items()}


def report(at: list[int], baseline: str, repeat: int) -> None:
    trees = checkouts(baseline)
    med = medians(__file__, trees, ["--at", ",".join(map(str, at))], repeat)
    against = f"; baseline {baseline}" if baseline else ""
    print(f"one model request on a long history: CPU µs of this process (median of {SAMPLES},"
          f" then of {repeat} process(es)){against}; longest stretch: wall µs on the event"
          " loop during a first request")  # fmt: skip
    columns: list[tuple[str, str]] = []
    for who in reversed(trees):
        if med[who][f"kept@{at[0]}"]:
            columns += [(who, "per request"), (who, "first request")]
        else:
            print(f"  {who}: keeps nothing between requests (each is a first request)")
            columns.append((who, "per request"))
        if f"openai longest stretch@{at[0]}" in med[who]:
            columns.append((who, "longest stretch"))
    heading = "".join(f"{f'{who}: {kind}':>27}" for who, kind in columns)
    ratio = f"{'this / baseline':>18}" if baseline else ""
    print(f"  {'':<34}{heading}{ratio}")
    for turn in at:
        m = med["this"]
        print(f"  at turn {turn:,} ({m[f'messages@{turn}']:,.0f} messages)")
        for name, label in (("openai", "OpenAI: the body"), ("plugin", "plugin model: the call")):
            size = m[f"{name} bytes@{turn}"]
            row = "".join(f"{med[who][f'{name} {kind}@{turn}']:>27,.0f}" for who, kind in columns)
            if baseline:
                key = f"{name} per request@{turn}"
                row += f"{m[key] / med['baseline'][key]:>17.3f}×"
            print(f"    {f'{label} ({size / 1e6:.2f} MB)':<32}{row}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--at", default="1000,3000", help="comma-separated turn numbers")
    parser.add_argument("--baseline", default="", help="another checkout to compare with")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (each a fresh process)")
    parser.add_argument("--worker", action="store_true", help="one run; print JSON")
    args = parser.parse_args()
    at = [int(t) for t in args.at.split(",")]
    if args.worker:
        print(json.dumps(asyncio.run(measure(at))))
        return
    report(at, args.baseline, args.repeat)


if __name__ == "__main__":
    main()
