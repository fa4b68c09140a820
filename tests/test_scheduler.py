"""The tool-batch scheduler: groups, the rolling pool, model-order commits and abort."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from server.kernel.abort import AbortController
from server.kernel.content import plain_text
from server.kernel.errors import Aborted
from server.kernel.seams import (
    TOOLS_POST_EXECUTE,
    TOOLS_PRE_EXECUTE,
    TOOLS_RESULT,
    SeamRegistry,
    ToolCallResult,
)
from server.kernel.tools import (
    ParallelSafe,
    ToolExecution,
    ToolOutcome,
    ToolRegistry,
    ToolReturn,
    ToolValue,
)
from server.loop.scheduler import DEFAULT_MAX_PARALLEL, Ran, ToolBatch, run_tool_batch
from server.loop.tool_pipeline import ToolPipeline
from tests.tool_helpers import Execute, PostNext, PreNext, context, make_tool


class Batch:
    """One agent's registry and seams, and a trace of everything a batch does."""

    def __init__(self) -> None:
        self.registry = ToolRegistry()
        self.seams = SeamRegistry()
        self.controller = AbortController()
        self.events: list[tuple[str, str]] = []
        self.outcomes: dict[str, ToolOutcome] = {}
        self.ran: dict[str, Ran | None] = {}
        self._seqs: dict[str, int] = {}

    def record(self, kind: str, call_id: str) -> None:
        self.events.append((kind, call_id))

    def tool(
        self, name: str, body: Execute | None = None, *, parallel_safe: ParallelSafe = True
    ) -> Callable[[], None]:
        """Register a tool that records its start and end around `body`."""

        async def execute(exec: ToolExecution) -> ToolValue:
            self.record("start", exec.call_id)
            result = await body(exec) if body is not None else f"{exec.call_id} done"
            self.record("end", exec.call_id)
            return result

        return self.registry.register(make_tool(name, execute, parallel_safe=parallel_safe))

    def gated(self, name: str, gates: dict[str, asyncio.Event]) -> None:
        """A parallel tool whose call `id` waits for `gates[id]` when there is one."""

        async def body(exec: ToolExecution) -> str:
            if exec.call_id in gates:
                await gates[exec.call_id].wait()
            return f"{exec.call_id} done"

        self.tool(name, body)

    async def run(self, *calls: tuple[str, str], max_parallel: object = 10) -> None:
        batch = ToolBatch(
            ToolPipeline(self.registry, self.seams, "a1", (), None, ()),
            agent_id="a1",
            turn=1,
            step=1,
            signal=self.controller.signal,
            max_parallel=max_parallel,  # type: ignore[arg-type]
            log=self,
        )
        await run_tool_batch(
            [c.ToolCallBlock(id=call_id, name=name, arguments="{}") for call_id, name in calls],
            batch,
        )

    # The batch's log (`BatchLog`): what it recorded, in order.
    def call(self, call: c.ToolCallBlock) -> int:
        self.record("call", call.id)
        self._seqs[call.id] = len(self.events)
        return self._seqs[call.id]

    def result(self, exec: ToolExecution, outcome: ToolOutcome, seq: int, ran: Ran | None) -> None:
        assert seq == self._seqs[exec.call_id]
        self.record("result", exec.call_id)
        self.outcomes[exec.call_id] = outcome
        self.ran[exec.call_id] = ran

    def context(self, delivered: d.HookContext) -> None:
        self.record("context", plain_text(delivered.content))

    def text(self, call_id: str) -> str:
        return plain_text(self.outcomes[call_id].content)


def trace(*steps: str) -> list[tuple[str, str]]:
    """`trace("call a", "start a")` as event tuples."""
    return [(kind, call_id) for kind, call_id in (step.split(" ", 1) for step in steps)]


async def test_parallel_siblings_all_start_before_any_completes() -> None:
    b = Batch()
    started: list[str] = []
    all_started = asyncio.Event()

    async def body(exec: ToolExecution) -> str:
        started.append(exec.call_id)
        if len(started) == 3:
            all_started.set()
        await all_started.wait()  # deadlocks unless all three are in flight
        return "ok"

    b.tool("p", body)
    async with asyncio.timeout(5):
        await b.run(("a", "p"), ("b", "p"), ("c", "p"))
    assert b.events == trace(
        "call a", "call b", "call c",
        "start a", "start b", "start c",
        "end c", "end a", "end b",
        "result a", "result b", "result c",
    )  # fmt: skip


async def test_an_exclusive_call_between_parallel_ones_makes_three_groups() -> None:
    b = Batch()
    b.tool("p")
    b.tool("x", parallel_safe=False)
    await b.run(("p1", "p"), ("p2", "p"), ("x", "x"), ("p3", "p"), ("p4", "p"))
    assert b.events == trace(
        "call p1", "call p2", "start p1", "end p1", "start p2", "end p2",
        "result p1", "result p2",
        "call x", "start x", "end x", "result x",
        "call p3", "call p4", "start p3", "end p3", "start p4", "end p4",
        "result p3", "result p4",
    )  # fmt: skip


async def test_reclassification_after_a_barrier_sees_the_replaced_tool() -> None:
    b = Batch()
    dispose_old = b.tool("y", parallel_safe=False)

    async def replace_y(exec: ToolExecution) -> str:
        dispose_old()

        async def new_y(exec: ToolExecution) -> str:
            return f"new {exec.call_id}"

        b.tool("y", new_y, parallel_safe=True)
        return "replaced"

    b.tool("x", replace_y, parallel_safe=False)
    await b.run(("x", "x"), ("y1", "y"), ("y2", "y"))
    # The new y is parallel: y1 and y2 now share a group.
    assert b.events == trace(
        "call x", "start x", "end x", "result x",
        "call y1", "call y2", "start y1", "end y1", "start y2", "end y2",
        "result y1", "result y2",
    )  # fmt: skip
    assert (b.text("y1"), b.text("y2")) == ("new y1", "new y2")


@pytest.mark.parametrize("flipper", ["tool", "observer", None])
async def test_making_the_next_call_exclusive_stops_replenishment(flipper: str | None) -> None:
    b = Batch()
    exclusive = False
    release_b = asyncio.Event()

    async def body(exec: ToolExecution) -> str:
        nonlocal exclusive
        if exec.call_id == "a" and flipper == "tool":
            exclusive = True
        if exec.call_id == "b":
            await release_b.wait()
        return "ok"

    def on_result(call: ToolCallResult) -> None:
        exec = call.exec
        nonlocal exclusive
        if exec.call_id == "a":
            exclusive = exclusive or flipper == "observer"
            release_b.set()

    b.tool("p", body, parallel_safe=lambda _args: not exclusive)
    b.seams.on(TOOLS_RESULT, on_result)
    await b.run(("a", "p"), ("b", "p"), ("c", "p"), max_parallel=2)
    head = trace("call a", "call b", "start a", "end a", "start b", "result a")
    if flipper is None:
        # Still parallel: c takes a's slot while b runs.
        tail = trace("call c", "end b", "start c", "end c", "result b", "result c")
    else:
        # Now exclusive: c waits for the pool to drain.
        tail = trace("end b", "result b", "call c", "start c", "end c", "result c")
    assert b.events == head + tail


async def test_results_commit_in_model_order_despite_out_of_order_settlement() -> None:
    b = Batch()
    gates = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def body(exec: ToolExecution) -> str:
        if exec.call_id in gates:
            await gates[exec.call_id].wait()
        # c releases b, b releases a: they settle in reverse order.
        (gates["b"] if exec.call_id == "c" else gates["a"]).set()
        return f"{exec.call_id} done"

    b.tool("p", body)
    await b.run(("a", "p"), ("b", "p"), ("c", "p"))
    assert b.events == trace(
        "call a", "call b", "call c",
        "start a", "start b", "start c",
        "end c", "end b", "end a",
        "result a", "result b", "result c",
    )  # fmt: skip
    assert [b.text(i) for i in "abc"] == ["a done", "b done", "c done"]
    # Each result keeps when its own tool ran, not when it was committed: c ended
    # first, then b, then a, and all three ran at once.
    a, b_ran, c_ran = (b.ran[i] for i in "abc")
    assert a is not None and b_ran is not None and c_ran is not None
    assert c_ran.end_ns <= b_ran.end_ns <= a.end_ns
    assert max(r.start_ns for r in (a, b_ran, c_ran)) <= c_ran.end_ns


@pytest.mark.parametrize("cap", [0, -1, 1.5, True, "2", None])
async def test_invalid_caps_are_rejected(cap: object) -> None:
    b = Batch()
    b.tool("p")
    with pytest.raises(ValueError, match="maxParallelToolCalls must be a positive integer"):
        await b.run(("a", "p"), max_parallel=cap)
    assert b.events == []


@pytest.mark.parametrize("cap", [DEFAULT_MAX_PARALLEL, 3])
async def test_at_most_cap_calls_are_in_flight(cap: int) -> None:
    b = Batch()
    running = peak = 0
    pool_full = asyncio.Event()

    async def body(exec: ToolExecution) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == cap:
            pool_full.set()
        await pool_full.wait()  # the first wave holds its slots until the pool is full
        running -= 1
        return "ok"

    b.tool("p", body)
    ids = [f"c{i}" for i in range(cap + 2)]
    async with asyncio.timeout(5):
        await b.run(*((i, "p") for i in ids), max_parallel=cap)
    assert DEFAULT_MAX_PARALLEL == 10
    assert peak == cap
    first_wave = [
        *trace(*(f"call {i}" for i in ids[:cap])),
        *trace(*(f"start {i}" for i in ids[:cap])),
    ]
    assert b.events[: 2 * cap] == first_wave
    assert b.events.index(("call", ids[cap])) > b.events.index(("end", ids[cap - 1]))
    assert [e for e in b.events if e[0] == "result"] == trace(*(f"result {i}" for i in ids))


async def test_cap_one_is_serial() -> None:
    b = Batch()
    b.tool("p")
    await b.run(("a", "p"), ("b", "p"), ("c", "p"), max_parallel=1)
    assert b.events == trace(
        "call a", "start a", "end a", "result a",
        "call b", "start b", "end b", "result b",
        "call c", "start c", "end c", "result c",
    )  # fmt: skip


def recording_seams(b: Batch, *, contexts: bool = False) -> None:
    """Pre- and post-execute listeners that record what they see."""

    async def pre(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        b.record("pre", exec.call_id)
        return await next()

    async def post(call: ToolCallResult, next: PostNext) -> d.PostToolDecision:
        exec = call.exec
        b.record("post", exec.call_id)
        await next()
        extra = [context(f"{exec.call_id}-post")] if contexts else []
        return d.PostToolDecision(accept=d.ToolAccept(additional_contexts=extra))

    b.seams.on(TOOLS_PRE_EXECUTE, pre)
    b.seams.on(TOOLS_POST_EXECUTE, post)


async def test_pre_and_post_execute_observe_model_order() -> None:
    b = Batch()
    recording_seams(b)
    gates = {"a": asyncio.Event()}
    b.gated("p", gates)

    async def release_a(exec: ToolExecution) -> str:
        gates["a"].set()
        return "released"

    b.tool("r", release_a)
    await b.run(("a", "p"), ("b", "p"), ("c", "r"))
    assert b.events == trace(
        "call a", "pre a", "call b", "pre b", "call c", "pre c",
        "start a", "start b", "end b", "start c", "end c", "end a",
        "post a", "result a", "post b", "result b", "post c", "result c",
    )  # fmt: skip


async def test_contexts_are_delivered_in_model_order() -> None:
    b = Batch()
    recording_seams(b, contexts=True)
    gate = asyncio.Event()

    async def body(exec: ToolExecution) -> ToolReturn:
        if exec.call_id == "a":
            await gate.wait()
        else:
            gate.set()
        return ToolReturn(f"{exec.call_id} done", contexts=[context(f"{exec.call_id}-tool")])

    b.tool("p", body)
    await b.run(("a", "p"), ("b", "p"))
    assert [e for e in b.events if e[0] in ("result", "context", "end")] == trace(
        "end b", "end a",
        "result a", "context a-tool", "context a-post",
        "result b", "context b-tool", "context b-post",
    )  # fmt: skip


async def test_denials_and_pre_execute_errors_are_ordered_and_not_dispatched() -> None:
    b = Batch()
    b.tool("p")

    async def pre(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        b.record("pre", exec.call_id)
        if exec.call_id == "a":
            return d.PreToolDecision(deny=d.ToolDeny(reason="denied a"))
        if exec.call_id == "b":
            raise RuntimeError("boom")
        return await next()

    async def post(call: ToolCallResult, next: PostNext) -> d.PostToolDecision:
        exec = call.exec
        b.record("post", exec.call_id)
        return await next()

    b.seams.on(TOOLS_PRE_EXECUTE, pre)
    b.seams.on(TOOLS_POST_EXECUTE, post)
    await b.run(("a", "p"), ("b", "p"), ("c", "p"))
    assert b.events == trace(
        "call a", "pre a", "post a", "result a",
        "call b", "pre b", "result b",  # a pre-execute throw skips post-execute
        "call c", "pre c", "start c", "end c", "post c", "result c",
    )  # fmt: skip
    assert [(b.text(i), b.outcomes[i].is_error) for i in "abc"] == [
        ("Error: denied a", True),
        ("Error: boom", True),
        ("c done", False),
    ]
    assert b.ran["a"] is None and b.ran["b"] is None  # they never ran: no run time
    ran = b.ran["c"]
    assert ran is not None and ran.start_ns <= ran.end_ns


async def test_an_unknown_tool_is_an_exclusive_error_result() -> None:
    b = Batch()
    b.tool("p")
    await b.run(("a", "p"), ("u", "nope"), ("b", "p"))
    assert b.events == trace(
        "call a", "start a", "end a", "result a",
        "call u", "result u",
        "call b", "start b", "end b", "result b",
    )  # fmt: skip
    assert b.text("u") == 'Error: unknown tool "nope"'
    assert b.outcomes["u"].error is not None
    assert b.outcomes["u"].error.code == "UNKNOWN_TOOL"


async def test_abort_before_the_batch_starts_nothing() -> None:
    b = Batch()
    b.tool("p")
    b.controller.abort("early")
    with pytest.raises(Aborted, match="early"):
        await b.run(("a", "p"), ("b", "p"))
    assert b.events == []


async def test_abort_inside_an_exclusive_call_prevents_the_rest() -> None:
    b = Batch()

    async def abort(exec: ToolExecution) -> str:
        b.controller.abort("user interrupt")
        return "aborted the step"

    b.tool("x", abort, parallel_safe=False)
    b.tool("p")
    with pytest.raises(Aborted, match="user interrupt"):
        await b.run(("x", "x"), ("p1", "p"), ("p2", "p"))
    assert b.events == trace("call x", "start x", "end x", "result x")
    assert b.text("x") == "aborted the step"


async def test_abort_during_ordered_pre_execute_starts_no_further_call() -> None:
    b = Batch()

    async def pre(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        b.controller.abort("stop")
        return await next()

    async def body(exec: ToolExecution) -> str:
        exec.signal.raise_if_aborted()
        return "unreachable"

    b.seams.on(TOOLS_PRE_EXECUTE, pre)
    b.tool("p", body)
    with pytest.raises(Aborted, match="stop"):
        await b.run(("a", "p"), ("b", "p"), ("c", "p"))
    # The started call is dispatched with the aborted signal and committed.
    assert b.events == trace("call a", "start a", "result a")
    assert b.text("a") == "Error: aborted: stop"


async def test_abort_mid_pool_commits_started_calls_and_starts_no_more() -> None:
    b = Batch()
    recording_seams(b, contexts=True)
    b_waiting = asyncio.Event()

    async def body(exec: ToolExecution) -> str:
        if exec.call_id == "a":
            await b_waiting.wait()
            b.controller.abort("stop")
            return "a done"
        b_waiting.set()
        await exec.signal.race(asyncio.Event().wait())
        return "unreachable"

    b.tool("p", body)
    with pytest.raises(Aborted, match="stop"):
        await b.run(("a", "p"), ("b", "p"), ("c", "p"), ("d", "p"), max_parallel=2)
    assert b.events == trace(
        "call a", "pre a", "call b", "pre b",
        "start a", "start b", "end a",
        "post a", "result a", "context a-post",
        "post b", "result b", "context b-post",
    )  # fmt: skip
    assert (b.text("a"), b.text("b")) == ("a done", "Error: aborted: stop")


async def test_no_exclusive_barrier_runs_after_an_aborted_parallel_group() -> None:
    b = Batch()

    async def body(exec: ToolExecution) -> str:
        if exec.call_id == "p1":
            b.controller.abort("stop")
        return "ok"

    b.tool("p", body)
    b.tool("x", parallel_safe=False)
    with pytest.raises(Aborted, match="stop"):
        await b.run(("p1", "p"), ("p2", "p"), ("x", "x"))
    assert b.events == trace(
        "call p1", "call p2", "start p1", "end p1", "start p2", "end p2", "result p1", "result p2"
    )


async def test_a_failing_callback_cancels_the_calls_in_flight() -> None:
    b = Batch()
    b.tool("quick")

    async def slow(exec: ToolExecution) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            b.record("cancelled", exec.call_id)
            raise
        return "unreachable"

    b.tool("slow", slow)
    original = b.record

    def failing_record(kind: str, call_id: str) -> None:
        if kind == "result" and call_id == "a":
            raise RuntimeError("append vetoed")
        original(kind, call_id)

    b.record = failing_record  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="append vetoed"):
        await b.run(("a", "quick"), ("s", "slow"))
    assert b.events == trace("call a", "call s", "start a", "end a", "start s", "cancelled s")
