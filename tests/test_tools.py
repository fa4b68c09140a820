"""The tool registry, the per-call pipeline and the built-in tools."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from collections.abc import Callable

import pytest
from google.protobuf import json_format

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from server.kernel.abort import NEVER, AbortController, AbortSignal
from server.kernel.content import plain_text, text_content
from server.kernel.errors import CodedError
from server.kernel.seams import (
    TOOLS_EXECUTE,
    TOOLS_POST_EXECUTE,
    TOOLS_PRE_EXECUTE,
    TOOLS_RESULT,
    SeamRegistry,
    ToolCallResult,
)
from server.kernel.tools import (
    NOT_LOSSLESS,
    ParallelSafe,
    ToolExecution,
    ToolOutcome,
    ToolRegistry,
    ToolReturn,
    ToolValue,
    canonical_order,
    parse_arguments,
)
from server.loop.builtin_tools import builtin_tools
from server.loop.tool_pipeline import ToolPipeline
from tests.tool_helpers import ExecNext, Execute, PostNext, PreNext, context, make_tool, ok


def make_exec(
    name: str = "t", arguments: str = "{}", signal: AbortSignal = NEVER, call_id: str = "c1"
) -> ToolExecution:
    call = c.ToolCallBlock(id=call_id, name=name, arguments=arguments)
    return ToolExecution.of(call, agent_id="a1", turn=1, step=1, signal=signal)


class Pipeline:
    """A registry, seams and the pipeline of agent a1 over them."""

    def __init__(self, enabled: tuple[str, ...] = ()) -> None:
        self.registry = ToolRegistry()
        self.seams = SeamRegistry()
        self.pipeline = ToolPipeline(self.registry, self.seams, "a1", enabled)
        self.log: list[str] = []

    def add(self, name: str = "t", execute: Execute = ok) -> None:
        self.registry.register(make_tool(name, execute))

    def record_post(self) -> None:
        async def post(call: ToolCallResult, next: PostNext) -> d.PostToolDecision:
            outcome = call.outcome
            self.log.append(f"post {plain_text(outcome.content)}")
            return await next()

        self.seams.on(TOOLS_POST_EXECUTE, post)

    async def run(
        self, name: str = "t", arguments: str = "{}", signal: AbortSignal = NEVER
    ) -> ToolOutcome:
        return await self.pipeline.run(make_exec(name, arguments, signal))


def texts(contexts: list[d.HookContext]) -> list[str]:
    return [plain_text(ctx.content) for ctx in contexts]


# Arguments.


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("", {}),
        ('{"a": [1, 2.5, null]}', {"a": [1, 2.5, None]}),
        ("3", 3),
        ("{not json", "{not json"),
        ("NaN", "NaN"),
        ('{"x": Infinity}', '{"x": Infinity}'),
    ],
)
def test_arguments_are_parsed_or_passed_through(raw: str, parsed: object) -> None:
    assert parse_arguments(raw) == parsed


def test_an_execution_keeps_the_raw_arguments() -> None:
    exec = make_exec("t", '{"a": 1}')
    assert (exec.call_id, exec.name, exec.arguments, exec.raw_arguments) == (
        "c1",
        "t",
        {"a": 1},
        '{"a": 1}',
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        exec.name = "other"  # type: ignore[misc]


# Registry: visibility and schemas.


def test_opt_in_tools_are_visible_only_when_enabled() -> None:
    registry = ToolRegistry()
    registry.register(make_tool("builtin", opt_in=True))
    registry.register(make_tool("plugin"))
    assert set(registry.visible("a1", [])) == {"plugin"}
    assert set(registry.visible("a1", ["builtin"])) == {"builtin", "plugin"}
    assert registry.lookup("builtin", "a1", []) is None
    assert registry.names() == {"builtin", "plugin"}


def test_a_scoped_tool_shadows_the_global_one_for_its_agent_only() -> None:
    registry = ToolRegistry()
    shared = make_tool("t")
    mine = make_tool("t", agent_id="a1")
    registry.register(shared)
    registry.register(mine)
    dispose_extra = registry.register(make_tool("extra", agent_id="a1"))
    assert registry.visible("a1", []) == {"t": mine, "extra": registry.lookup("extra", "a1", [])}
    assert registry.visible("a2", []) == {"t": shared}
    assert registry.names() == {"t"}
    registry.remove_agent("a1")
    assert registry.visible("a1", []) == {"t": shared}
    dispose_extra()  # after remove_agent, a disposer has nothing left to do


def test_registration_is_checked_and_disposable() -> None:
    registry = ToolRegistry()
    dispose = registry.register(make_tool("t"))
    with pytest.raises(ValueError, match='tool "t" is already registered'):
        registry.register(make_tool("t"))
    with pytest.raises(ValueError, match="needs a name"):
        registry.register(make_tool(""))
    bad_schema = dataclasses.replace(make_tool("u"), input_schema={"max": float("nan")})
    with pytest.raises(TypeError, match="losslessly JSON-serializable"):
        registry.register(bad_schema)
    dispose()
    replacement = make_tool("t")
    registry.register(replacement)
    dispose()  # a stale disposer leaves the replacement alone
    assert registry.visible("a1", []) == {"t": replacement}


def test_schemas_are_in_lexicographic_order_regardless_of_registration() -> None:
    registry = ToolRegistry()
    for name in ["delta", "alpha", "charlie", "bravo"]:
        registry.register(make_tool(name))
    schemas = registry.schemas("a1", [])
    assert [s.name for s in schemas] == ["alpha", "bravo", "charlie", "delta"]
    assert schemas[0].description == "The alpha tool."
    assert json_format.MessageToDict(schemas[0].input_schema) == {
        "type": "object",
        "properties": {},
    }
    schemas[0].name = "mutated"  # callers get copies
    assert registry.schemas("a1", [])[0].name == "alpha"


def test_tool_order_is_honoured() -> None:
    registry = ToolRegistry()
    for name in ["delta", "alpha", "charlie", "bravo"]:
        registry.register(make_tool(name))
    order = ["charlie", "<unlisted-tools>", "alpha"]
    assert [s.name for s in registry.schemas("a1", [], order)] == [
        "charlie",
        "bravo",
        "delta",
        "alpha",
    ]


@pytest.mark.parametrize(
    ("order", "message"),
    [
        (["ghost", "<unlisted-tools>"], 'unknown tool "ghost"'),
        (["alpha"], "exactly once"),
        (["<unlisted-tools>", "alpha", "<unlisted-tools>"], "exactly once"),
        (["alpha", "<unlisted-tools>", "alpha"], "twice"),
    ],
)
def test_an_invalid_tool_order_is_refused(order: list[str], message: str) -> None:
    registry = ToolRegistry()
    registry.register(make_tool("alpha"))
    registry.register(make_tool("hidden", opt_in=True))
    with pytest.raises(CodedError, match=message) as caught:
        registry.schemas("a1", [], order)
    assert caught.value.code == "INVALID_TOOL_ORDER"


def test_a_tool_order_may_name_registered_tools_an_agent_does_not_see() -> None:
    registry = ToolRegistry()
    registry.register(make_tool("alpha"))
    registry.register(make_tool("hidden", opt_in=True))
    order = ["hidden", "<unlisted-tools>"]
    assert [s.name for s in registry.schemas("a1", [], order)] == ["alpha"]
    assert [s.name for s in registry.schemas("a1", ["hidden"], order)] == ["hidden", "alpha"]


def test_canonical_order_without_tool_order_sorts() -> None:
    assert canonical_order({"b", "a"}, None) == ["a", "b"]
    assert canonical_order({"b", "a"}, ["<unlisted-tools>"]) == ["a", "b"]


# Registry: execution mode.


def raises(_args: object) -> object:
    raise RuntimeError("classifier failed")


@pytest.mark.parametrize(
    ("parallel_safe", "mode"),
    [
        (True, "parallel"),
        (False, "exclusive"),
        (lambda args: True, "parallel"),
        (lambda args: args == {"safe": True}, "parallel"),
        (lambda args: 1, "exclusive"),
        (lambda args: "yes", "exclusive"),
        (lambda args: None, "exclusive"),
        (raises, "exclusive"),
    ],
)
def test_only_an_exact_true_is_parallel(parallel_safe: ParallelSafe, mode: str) -> None:
    registry = ToolRegistry()
    registry.register(make_tool("t", parallel_safe=parallel_safe))
    exec = make_exec("t", '{"safe": true}')
    assert registry.execution_mode(exec, registry.visible("a1", [])) == mode


def test_unknown_and_hidden_tools_are_exclusive() -> None:
    registry = ToolRegistry()
    registry.register(make_tool("hidden", parallel_safe=True, opt_in=True))
    visible = registry.visible("a1", [])
    assert registry.execution_mode(make_exec("hidden"), visible) == "exclusive"
    assert registry.execution_mode(make_exec("nope"), visible) == "exclusive"
    enabled = registry.visible("a1", ["hidden"])
    assert registry.execution_mode(make_exec("hidden"), enabled) == "parallel"


# Pipeline: results and failures.


async def test_a_tool_result_is_normalised_to_content() -> None:
    p = Pipeline()
    p.add("t")

    async def blocks(exec: ToolExecution) -> ToolValue:
        return [*text_content("a"), *text_content("b")]

    async def rich(exec: ToolExecution) -> ToolValue:
        return ToolReturn("half", is_error=True, meta={"n": 1}, contexts=[context("later")])

    p.add("blocks", blocks)
    p.add("rich", rich)
    plain = await p.run("t")
    assert (plain_text(plain.content), plain.is_error, plain.error, plain.meta) == (
        "t ok",
        False,
        None,
        None,
    )
    assert plain_text((await p.run("blocks")).content) == "ab"
    outcome = await p.run("rich")
    assert (plain_text(outcome.content), outcome.is_error, outcome.meta) == ("half", True, {"n": 1})
    assert texts(outcome.contexts) == ["later"]


async def test_an_unknown_tool_is_an_error_result_that_still_passes_post_execute() -> None:
    p = Pipeline()
    p.record_post()
    outcome = await p.run("nope")
    assert plain_text(outcome.content) == 'Error: unknown tool "nope"'
    assert outcome.is_error
    assert outcome.error is not None
    assert (outcome.error.name, outcome.error.code) == ("ToolNotFoundError", "UNKNOWN_TOOL")
    assert p.log == ['post Error: unknown tool "nope"']


class QuotaError(CodedError):
    pass


@pytest.mark.parametrize(
    ("exc", "text", "error"),
    [
        (ValueError("bad input"), "Error: bad input", None),
        (RuntimeError(), "Error: RuntimeError", None),
        (CodedError("uncoded"), "Error: uncoded", None),
        (QuotaError("over quota", "QUOTA"), "Error: over quota", ("QuotaError", "QUOTA")),
    ],
)
async def test_a_throwing_tool_becomes_an_error_result(
    exc: Exception, text: str, error: tuple[str, str] | None
) -> None:
    p = Pipeline()

    async def throw(exec: ToolExecution) -> ToolValue:
        raise exc

    p.add("t", throw)
    p.record_post()
    outcome = await p.run()
    assert (plain_text(outcome.content), outcome.is_error) == (text, True)
    assert (None if outcome.error is None else (outcome.error.name, outcome.error.code)) == error
    assert p.log == [f"post {text}"]  # a tool failure is not a pipeline failure


async def test_a_bad_return_value_is_an_error_result() -> None:
    p = Pipeline()

    async def bad(exec: ToolExecution) -> ToolValue:
        return 42  # type: ignore[return-value]

    p.add("t", bad)
    outcome = await p.run()
    assert plain_text(outcome.content) == (
        "Error: a tool must return text, content blocks or a ToolReturn, not int"
    )


async def test_an_aborted_tool_becomes_an_aborted_error_result() -> None:
    p = Pipeline()
    controller = AbortController()

    async def abort_then_race(exec: ToolExecution) -> ToolValue:
        controller.abort("user interrupt")
        exec.signal.raise_if_aborted()
        return "unreachable"

    p.add("t", abort_then_race)
    outcome = await p.run(signal=controller.signal)
    assert (plain_text(outcome.content), outcome.is_error, outcome.error) == (
        "Error: aborted: user interrupt",
        True,
        None,
    )


async def test_a_tool_cancelled_by_the_signal_becomes_an_aborted_result() -> None:
    p = Pipeline()
    controller = AbortController()
    waiting = asyncio.Event()

    async def wait_forever(exec: ToolExecution) -> ToolValue:
        inner = asyncio.ensure_future(asyncio.Event().wait())

        def cancel(_reason: str) -> None:
            inner.cancel()

        exec.signal.on_abort(cancel)
        waiting.set()
        await inner
        return "unreachable"

    p.add("t", wait_forever)
    task = asyncio.create_task(p.run(signal=controller.signal))
    await waiting.wait()
    controller.abort("halt")
    assert plain_text((await task).content) == "Error: aborted: halt"


async def test_cancelling_the_caller_is_not_swallowed() -> None:
    p = Pipeline()
    waiting = asyncio.Event()

    async def wait_forever(exec: ToolExecution) -> ToolValue:
        waiting.set()
        await asyncio.Event().wait()
        return "unreachable"

    p.add("t", wait_forever)
    task = asyncio.create_task(p.pipeline.dispatch(make_exec()))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# Pipeline: pre-execute, approval and guards.


async def test_a_denied_call_is_not_dispatched_but_passes_post_execute() -> None:
    p = Pipeline()
    ran: list[str] = []

    async def body(exec: ToolExecution) -> ToolValue:
        ran.append(exec.call_id)
        return "ran"

    async def deny(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        return d.PreToolDecision(deny=d.ToolDeny(reason="not today"))

    p.add("t", body)
    p.seams.on(TOOLS_PRE_EXECUTE, deny)
    p.record_post()
    outcome = await p.run()
    assert (plain_text(outcome.content), outcome.is_error, outcome.error) == (
        "Error: not today",
        True,
        None,
    )
    assert ran == []
    assert p.log == ["post Error: not today"]


@pytest.mark.parametrize(
    ("reason", "text"),
    [
        ("needs a human", "Error: needs a human"),
        ("", 'Error: tool "t" requires approval (no approval channel is available)'),
    ],
)
async def test_ask_is_a_denial_without_an_approval_channel(reason: str, text: str) -> None:
    p = Pipeline()
    p.add()

    async def ask(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        return d.PreToolDecision(ask=d.ToolAsk(reason=reason))

    p.seams.on(TOOLS_PRE_EXECUTE, ask)
    outcome = await p.run()
    assert (plain_text(outcome.content), outcome.is_error) == (text, True)


async def test_pre_execute_listeners_chain_and_allow() -> None:
    p = Pipeline()
    p.add()
    seen: list[str] = []

    async def outer(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        seen.append("outer")
        return await next()

    async def allow(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        seen.append("inner")
        return d.PreToolDecision(allow=d.ToolAllow())

    p.seams.on(TOOLS_PRE_EXECUTE, outer, order=1)
    p.seams.on(TOOLS_PRE_EXECUTE, allow, order=2)
    assert plain_text((await p.run()).content) == "t ok"
    assert seen == ["outer", "inner"]


@pytest.mark.parametrize(
    ("listener_result", "text"),
    [
        (QuotaError("policy down", "POLICY"), "Error: policy down"),
        ("not a decision", "Error: a tools/pre-execute listener must return a PreToolDecision"),
    ],
)
async def test_a_failing_pre_execute_listener_gives_a_final_error(
    listener_result: object, text: str
) -> None:
    p = Pipeline()
    ran: list[str] = []

    async def body(exec: ToolExecution) -> ToolValue:
        ran.append("body")
        return "ran"

    async def pre(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        if isinstance(listener_result, Exception):
            raise listener_result
        return listener_result  # type: ignore[return-value]  # not always a decision

    p.add("t", body)
    p.seams.on(TOOLS_PRE_EXECUTE, pre)
    p.record_post()
    outcome = await p.run()
    assert (plain_text(outcome.content), outcome.is_error) == (text, True)
    assert ran == []
    assert p.log == []  # post-execute is skipped


async def test_guards_run_global_first_and_the_first_reason_wins() -> None:
    p = Pipeline()
    p.add()
    seen: list[str] = []

    def guard(name: str, reason: str | None) -> Callable[[ToolExecution], str | None]:
        def check(exec: ToolExecution) -> str | None:
            seen.append(name)
            return reason

        return check

    p.registry.guard(guard("agent", "agent says no"), agent_id="a1")
    p.registry.guard(guard("other agent", "never asked"), agent_id="a2")
    p.registry.guard(guard("global pass", None))
    dispose = p.registry.guard(guard("global deny", "global says no"))
    assert plain_text((await p.run()).content) == "Error: global says no"
    assert seen == ["global pass", "global deny"]
    dispose()
    seen.clear()
    assert plain_text((await p.run()).content) == "Error: agent says no"
    assert seen == ["global pass", "agent"]


async def test_guards_are_skipped_when_pre_execute_denies() -> None:
    p = Pipeline()
    p.add()
    seen: list[str] = []

    def guard(exec: ToolExecution) -> str | None:
        seen.append("guard")
        return None

    async def deny(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        return d.PreToolDecision(deny=d.ToolDeny(reason="no"))

    p.registry.guard(guard)
    p.seams.on(TOOLS_PRE_EXECUTE, deny)
    assert plain_text((await p.run()).content) == "Error: no"
    assert seen == []


async def test_a_throwing_guard_gives_a_final_error() -> None:
    p = Pipeline()
    p.add()
    p.record_post()

    def guard(exec: ToolExecution) -> str | None:
        raise RuntimeError("guard broke")

    p.registry.guard(guard)
    assert plain_text((await p.run()).content) == "Error: guard broke"
    assert p.log == []


# Pipeline: the execute waterfall.


async def test_an_execute_wrapper_may_replace_only_the_signal() -> None:
    p = Pipeline()
    replacement = AbortController()
    seen: list[tuple[str, AbortSignal]] = []

    async def body(exec: ToolExecution) -> ToolValue:
        seen.append((exec.name, exec.signal))
        return "ran"

    async def wrapper(exec: ToolExecution, next: ExecNext) -> ToolOutcome:
        renamed = dataclasses.replace(exec, name="other", signal=replacement.signal)
        return await next(renamed)

    p.add("t", body)
    p.seams.on(TOOLS_EXECUTE, wrapper)
    assert plain_text((await p.run()).content) == "ran"
    assert seen == [("t", replacement.signal)]


async def test_execute_wrappers_see_normalised_results_and_may_retry() -> None:
    p = Pipeline()
    attempts: list[int] = []

    async def flaky(exec: ToolExecution) -> ToolValue:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            raise RuntimeError("flaky")
        return "second time"

    async def retry(exec: ToolExecution, next: ExecNext) -> ToolOutcome:
        first = await next()
        assert isinstance(first, ToolOutcome)
        assert plain_text(first.content) == "Error: flaky"  # already normalised
        return await next() if first.is_error else first

    p.add("t", flaky)
    p.seams.on(TOOLS_EXECUTE, retry)
    assert plain_text((await p.run()).content) == "second time"
    assert attempts == [0, 1]


async def test_an_execute_wrapper_may_short_circuit() -> None:
    p = Pipeline()
    ran: list[str] = []

    async def body(exec: ToolExecution) -> ToolValue:
        ran.append("body")
        return "ran"

    async def cached(exec: ToolExecution, next: ExecNext) -> ToolOutcome:
        return ToolOutcome(text_content("from cache"))

    p.add("t", body)
    p.seams.on(TOOLS_EXECUTE, cached)
    assert plain_text((await p.run()).content) == "from cache"
    assert ran == []


async def test_a_throwing_execute_wrapper_gives_a_final_error() -> None:
    p = Pipeline()
    p.add()
    p.record_post()

    async def broken(exec: ToolExecution, next: ExecNext) -> ToolOutcome:
        await next()
        raise RuntimeError("wrapper broke")

    p.seams.on(TOOLS_EXECUTE, broken)
    outcome = await p.run()
    assert (plain_text(outcome.content), outcome.is_error) == ("Error: wrapper broke", True)
    assert p.log == []


async def test_execute_wrappers_of_other_agents_do_not_apply() -> None:
    p = Pipeline()
    p.add()

    async def hijack(exec: ToolExecution, next: ExecNext) -> ToolOutcome:
        return ToolOutcome(text_content("hijacked"))

    p.seams.on(TOOLS_EXECUTE, hijack, agent_id="a2")
    assert plain_text((await p.run()).content) == "t ok"


# Pipeline: post-execute, meta and the result emit.


async def with_contexts(exec: ToolExecution) -> ToolValue:
    return ToolReturn("result", meta={"k": "v"}, contexts=[context("tool")])


async def run_with_post(decision: d.PostToolDecision) -> ToolOutcome:
    p = Pipeline()
    p.add("t", with_contexts)

    async def post(call: ToolCallResult, next: PostNext) -> d.PostToolDecision:
        outcome = call.outcome
        outcome.content.clear()  # listeners get a copy
        return decision

    p.seams.on(TOOLS_POST_EXECUTE, post)
    return await p.run()


async def test_post_execute_accept_keeps_or_replaces_content_and_adds_contexts() -> None:
    kept = await run_with_post(d.PostToolDecision())
    assert (plain_text(kept.content), texts(kept.contexts)) == ("result", ["tool"])
    accept = d.ToolAccept(content=text_content("rewritten"), additional_contexts=[context("post")])
    rewritten = await run_with_post(d.PostToolDecision(accept=accept))
    assert (plain_text(rewritten.content), rewritten.is_error) == ("rewritten", False)
    assert texts(rewritten.contexts) == ["tool", "post"]
    assert rewritten.meta == {"k": "v"}


async def test_post_execute_block_replaces_the_result_and_keeps_only_its_contexts() -> None:
    block = d.ToolBlock(feedback="blocked: too long", additional_contexts=[context("why")])
    outcome = await run_with_post(d.PostToolDecision(block=block))
    assert (plain_text(outcome.content), outcome.is_error) == ("blocked: too long", True)
    assert texts(outcome.contexts) == ["why"]


async def test_a_throwing_post_execute_listener_gives_an_error_result() -> None:
    p = Pipeline()
    p.add("t", with_contexts)

    async def post(call: ToolCallResult, next: PostNext) -> d.PostToolDecision:
        raise RuntimeError("post broke")

    p.seams.on(TOOLS_POST_EXECUTE, post)
    outcome = await p.run()
    assert (plain_text(outcome.content), outcome.is_error) == ("Error: post broke", True)
    assert (outcome.meta, outcome.contexts) == (None, [])


@pytest.mark.parametrize(
    "meta", [{"x": float("nan")}, {"s": {1, 2}}, {1: "key"}, [1, 2], {"lock": threading.Lock()}]
)
async def test_meta_that_is_not_lossless_json_becomes_an_error_result(meta: object) -> None:
    p = Pipeline()
    p.record_post()  # post-execute runs first, on a copy

    async def body(exec: ToolExecution) -> ToolValue:
        return ToolReturn("fine", meta=meta, contexts=[context("kept")])  # type: ignore[arg-type]

    p.add("t", body)
    outcome = await p.run()
    assert (plain_text(outcome.content), outcome.is_error, outcome.meta) == (
        NOT_LOSSLESS,
        True,
        None,
    )
    assert texts(outcome.contexts) == ["kept"]


async def test_tools_result_observers_see_the_final_result_but_cannot_change_it() -> None:
    p = Pipeline()
    p.add()
    seen: list[tuple[str, str, bool]] = []

    def observe(call: ToolCallResult) -> None:
        exec, outcome = call.exec, call.outcome
        seen.append((exec.call_id, plain_text(outcome.content), outcome.is_error))
        outcome.content.clear()

    def broken(call: ToolCallResult) -> None:
        raise RuntimeError("observer broke")

    async def deny(exec: ToolExecution, next: PreNext) -> d.PreToolDecision:
        return d.PreToolDecision(deny=d.ToolDeny(reason="no")) if exec.name == "x" else await next()

    p.seams.on(TOOLS_RESULT, observe)
    p.seams.on(TOOLS_RESULT, broken)
    p.seams.on(TOOLS_PRE_EXECUTE, deny)
    outcome = await p.run()
    denied = await p.run("x")
    assert plain_text(outcome.content) == "t ok"
    assert plain_text(denied.content) == "Error: no"
    assert seen == [("c1", "t ok", False), ("c1", "Error: no", True)]
    assert p.seams.contained_failures == 2


# Built-in tools.


def builtin_pipeline(seams: SeamRegistry | None = None) -> ToolPipeline:
    registry = ToolRegistry()
    for tool in builtin_tools():
        registry.register(tool)
    return ToolPipeline(registry, seams or SeamRegistry(), "a1", registry.names())


def test_builtin_tools_are_opt_in_with_object_schemas() -> None:
    tools = builtin_tools()
    assert [t.name for t in tools] == ["current_time", "echo", "sleep", "word_count"]
    assert all(t.opt_in and t.description for t in tools)
    assert all(t.input_schema["type"] == "object" for t in tools)
    registry = ToolRegistry()
    for tool in tools:
        registry.register(tool)
    assert registry.visible("a1", []) == {}
    modes = {
        t.name: registry.execution_mode(make_exec(t.name), registry.visible("a1", [t.name]))
        for t in tools
    }
    assert modes == {
        "current_time": "parallel",
        "echo": "exclusive",
        "sleep": "parallel",
        "word_count": "parallel",
    }


@pytest.mark.parametrize(
    ("name", "arguments", "text"),
    [
        ("word_count", '{"text": "the quick  brown\\nfox"}', "4 words"),
        ("word_count", '{"text": ""}', "0 words"),
        ("echo", '{"text": "hello"}', "hello"),
        ("sleep", '{"seconds": 0}', "slept 0 seconds"),
        ("sleep", '{"seconds": 0.001}', "slept 0.001 seconds"),
    ],
)
async def test_builtin_tools_work(name: str, arguments: str, text: str) -> None:
    outcome = await builtin_pipeline().run(make_exec(name, arguments))
    assert (plain_text(outcome.content), outcome.is_error) == (text, False)


async def test_current_time_is_iso_8601_utc() -> None:
    outcome = await builtin_pipeline().run(make_exec("current_time", ""))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", plain_text(outcome.content))


@pytest.mark.parametrize(
    ("name", "arguments", "problem"),
    [
        ("word_count", "{}", 'word_count: "text" is required'),
        ("word_count", '{"text": 3}', 'word_count: "text" must be a string, not a number'),
        ("word_count", "{oops", "word_count: the arguments are not valid JSON"),
        ("echo", "[1]", "echo: the arguments must be a JSON object, not an array"),
        ("echo", '{"text": "a", "loud": true}', 'echo: unexpected argument "loud"'),
        ("current_time", '{"zone": "CET"}', 'current_time: unexpected argument "zone"'),
        ("sleep", '{"seconds": "1"}', 'sleep: "seconds" must be a number, not a string'),
        ("sleep", '{"seconds": true}', 'sleep: "seconds" must be a number, not a boolean'),
        ("sleep", '{"seconds": 301}', 'sleep: "seconds" must be between 0 and 300'),
        ("sleep", '{"seconds": -1}', 'sleep: "seconds" must be between 0 and 300'),
    ],
)
async def test_builtin_tools_explain_invalid_arguments(
    name: str, arguments: str, problem: str
) -> None:
    outcome = await builtin_pipeline().run(make_exec(name, arguments))
    assert (plain_text(outcome.content), outcome.is_error) == (f"Error: {problem}", True)
    assert outcome.error is not None
    assert (outcome.error.name, outcome.error.code) == ("ToolArgumentsError", "INVALID_ARGUMENTS")


async def test_sleep_honours_the_abort_signal() -> None:
    controller = AbortController()
    seams = SeamRegistry()
    sleeping = asyncio.Event()

    async def mark(exec: ToolExecution, next: ExecNext) -> ToolOutcome:
        sleeping.set()  # the waiter resumes once the tool is inside its sleep
        return await next()

    seams.on(TOOLS_EXECUTE, mark)
    pipeline = builtin_pipeline(seams)
    task = asyncio.create_task(
        pipeline.run(make_exec("sleep", '{"seconds": 300}', controller.signal))
    )
    await sleeping.wait()
    controller.abort("user interrupt")
    outcome = await task
    assert (plain_text(outcome.content), outcome.is_error) == (
        "Error: aborted: user interrupt",
        True,
    )


async def test_sleep_with_an_already_aborted_signal_does_not_start() -> None:
    controller = AbortController()
    controller.abort("early")
    outcome = await builtin_pipeline().run(
        make_exec("sleep", '{"seconds": 300}', controller.signal)
    )
    assert plain_text(outcome.content) == "Error: aborted: early"
