"""Human approval over the API, through a real server: ask, wait, answer.

An agent whose `approval_required_tools` names a tool (or whose pre-execute listener
answers `ask`) holds each call of it: an `approval_requested` event, a live agent
event, an entry in `GetAgent` / `ListApprovals`; then `ResolveApproval` or an
approver plugin answers, or a cancel or the timeout ends it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, approval_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.kernel import seams as S
from server.kernel.tools import ToolExecution, ToolOutcome
from server.models.scripted_options import script_options
from server.settings.config import Config, load_config
from tests.e2e.conftest import (
    E2E,
    READ_TIMEOUT,
    EventStream,
    kinds,
    of_kind,
    read_turn,
    running_app,
    text_of,
)
from tests.fake_openai import FakeOpenAI, Reply, call, chunk, text
from tests.invariants import check_log
from tests.processes import REPO, PluginLauncher, configurable, node

T = READ_TIMEOUT

ALLOW = approval_pb2.APPROVAL_DECISION_ALLOW_ONCE
REJECT = approval_pb2.APPROVAL_DECISION_REJECT


def step_calling(*calls: tuple[str, str, dict[str, object]]) -> scripted_pb2.ScriptedStep:
    """A scripted step making tool calls (id, name, arguments)."""
    return scripted_pb2.ScriptedStep(
        tool_calls=[
            scripted_pb2.ScriptedToolCall(id=i, name=n, arguments=json.dumps(a))
            for i, n, a in calls
        ]
    )


def approval_options(
    *steps: scripted_pb2.ScriptedStep,
    tools: tuple[str, ...] = ("word_count",),
    required: tuple[str, ...] = ("word_count",),
    timeout_ms: int | None = None,
) -> agent_pb2.AgentOptions:
    """A scripted agent whose `required` tools need approval."""
    options = agent_pb2.AgentOptions(
        provider="scripted",
        model="m",
        provider_options=script_options(list(steps)),
        tools=list(tools),
        approval_required_tools=list(required),
    )
    if timeout_ms is not None:
        options.approval_timeout.CopyFrom(
            duration_pb2.Duration(seconds=timeout_ms // 1000, nanos=(timeout_ms % 1000) * 10**6)
        )
    return options


WORD_COUNT_THEN_DONE = (
    step_calling(("w1", "word_count", {"text": "one two three"})),
    scripted_pb2.ScriptedStep(text="done"),
)


async def create(e2e: E2E, agent_id: str, options: agent_pb2.AgentOptions) -> None:
    await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id=agent_id, options=options), timeout=T
    )


async def send(e2e: E2E, agent_id: str, text_: str = "count") -> int:
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id=agent_id, text=text_), timeout=T
    )
    return sent.next_seq


async def resolve(
    e2e: E2E, agent_id: str, approval_id: str, decision: int, reason: str = "", rid: str = ""
) -> api.ResolveApprovalResponse:
    return await e2e.agents.ResolveApproval(
        api.ResolveApprovalRequest(
            agent_id=agent_id,
            approval_id=approval_id,
            decision=decision,  # type: ignore[arg-type]
            reason=reason,
            request_id=rid,
        ),
        timeout=T,
    )


async def refused(call_: object) -> tuple[grpc.StatusCode, error_details_pb2.ErrorInfo]:
    """The status code and ErrorInfo of a refused call."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call_  # type: ignore[misc]
    error = caught.value
    details = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return error.code(), info


async def all_events(e2e: E2E, agent_id: str) -> list[ev.SessionEvent]:
    page = await e2e.agents.ListSessionEvents(
        api.ListSessionEventsRequest(agent_id=agent_id, page_size=5000), timeout=T
    )
    return list(page.events)


# -- ask, answer ---------------------------------------------------------------------------


async def test_ask_then_allow_runs_the_tool(e2e: E2E) -> None:
    await create(e2e, "a1", approval_options(*WORD_COUNT_THEN_DONE))
    with EventStream(e2e.agents, agent_id="a1", from_seq=0) as stream:
        first = await stream.next()
        assert first is not None and first.subscribed  # no live event is missed from here
        await send(e2e, "a1")
        requested = (await stream.until("approval_requested")).approval_requested
        live = await stream.until_agent_event(lambda e: e.HasField("approval_requested"))
        assert live.approval_requested == requested
        assert (requested.call_id, requested.tool_name) == ("w1", "word_count")
        assert json.loads(requested.arguments) == {"text": "one two three"}
        assert requested.requested_by == "options.approval_required_tools"
        assert requested.approval_id and requested.HasField("expire_time")

        # The agent shows it waits; nothing ran yet.
        agent = (await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id="a1"), timeout=T)).agent
        assert list(agent.pending_approvals) == [requested]
        listed = await e2e.agents.ListApprovals(api.ListApprovalsRequest(agent_id="a1"), timeout=T)
        assert list(listed.approvals) == [requested]
        assert "tool_result" not in kinds(stream.events)

        answer = await resolve(e2e, "a1", requested.approval_id, ALLOW)
        assert answer.resolution.outcome == approval_pb2.APPROVAL_OUTCOME_ALLOWED_ONCE
        assert answer.resolution.resolved_by == "api"
        resolved = await stream.until_agent_event(lambda e: e.HasField("approval_resolved"))
        assert resolved.approval_resolved == answer.resolution
        end = await stream.until("turn_end")
    events = stream.events
    assert end.turn_end.reason.WhichOneof("kind") == "completed"
    k = kinds(events)
    assert k.index("tool_call") < k.index("approval_requested")
    assert k.index("approval_requested") < k.index("approval_resolved") < k.index("tool_result")
    (result,) = of_kind(events, "tool_result")
    assert text_of(result.tool_result.content) == "3 words"
    assert not result.tool_result.is_error
    listed = await e2e.agents.ListApprovals(api.ListApprovalsRequest(agent_id="a1"), timeout=T)
    assert not listed.approvals
    check_log(await all_events(e2e, "a1"))


async def test_a_rejection_with_a_reason_reaches_the_model_exactly(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.script(
            Reply(events=[call(0, '{"text": "a b"}', call_id="c1", name="word_count"),
                          chunk(finish="tool_calls")]),
            Reply(events=text("understood")),
        )  # fmt: skip
        config_file = tmp_path / "agentloop.yaml"
        config_file.write_text(
            "listen: 127.0.0.1:0\nstore: memory\nagents: []\nproviders:\n"
            f"  - name: fake\n    baseUrl: {fake.base_url}\n    defaultModel: gpt-test\n"
        )
        async with running_app(load_config(config_file)) as e2e:
            options = agent_pb2.AgentOptions(
                provider="fake", tools=["word_count"], approval_required_tools=["word_count"]
            )
            await create(e2e, "r1", options)
            start = await send(e2e, "r1")
            with EventStream(e2e.agents, agent_id="r1", from_seq=start) as stream:
                requested = (await stream.until("approval_requested")).approval_requested
                answer = await resolve(e2e, "r1", requested.approval_id, REJECT, "too risky")
                await stream.until("turn_end")
            assert answer.resolution.outcome == approval_pb2.APPROVAL_OUTCOME_REJECTED
            assert answer.resolution.reason == "too risky"
            (result,) = of_kind(stream.events, "tool_result")
            assert result.tool_result.is_error
            check_log(await all_events(e2e, "r1"))
        _, second = fake.requests
        tool_message = second.body["messages"][-1]
        assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "c1"
        assert tool_message["content"] == 'Error: the user rejected tool "word_count": too risky'


async def test_an_unanswered_approval_times_out_as_a_denial(e2e: E2E) -> None:
    await create(e2e, "t1", approval_options(*WORD_COUNT_THEN_DONE, timeout_ms=200))
    events = await read_turn(e2e.agents, "t1", await send(e2e, "t1"))
    (resolved,) = of_kind(events, "approval_resolved")
    assert resolved.approval_resolved.outcome == approval_pb2.APPROVAL_OUTCOME_TIMED_OUT
    assert resolved.approval_resolved.resolved_by == "server"
    (result,) = of_kind(events, "tool_result")
    assert result.tool_result.is_error
    assert text_of(result.tool_result.content) == (
        'Error: approval for tool "word_count" timed out after 0.2 seconds'
    )
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    # Too late: the approval ended; the refusal says how.
    code, info = await refused(resolve(e2e, "t1", resolved.approval_resolved.approval_id, ALLOW))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert info.reason == "APPROVAL_RESOLVED"
    assert info.metadata["outcome"] == "APPROVAL_OUTCOME_TIMED_OUT"
    check_log(await all_events(e2e, "t1"))


async def test_cancel_while_waiting_cancels_the_approval(e2e: E2E) -> None:
    await create(e2e, "c1", approval_options(*WORD_COUNT_THEN_DONE))
    start = await send(e2e, "c1")
    with EventStream(e2e.agents, agent_id="c1", from_seq=start) as stream:
        requested = (await stream.until("approval_requested")).approval_requested
        cancelled = await e2e.agents.CancelTurn(
            api.CancelTurnRequest(agent_id="c1", reason="changed my mind"), timeout=T
        )
        assert cancelled.cancelled
        end = await stream.until("turn_end")
    assert end.turn_end.reason.aborted.reason == "changed my mind"
    (resolved,) = of_kind(stream.events, "approval_resolved")
    assert resolved.approval_resolved.outcome == approval_pb2.APPROVAL_OUTCOME_CANCELLED
    assert resolved.approval_resolved.resolved_by == "server"
    (result,) = of_kind(stream.events, "tool_result")
    assert text_of(result.tool_result.content) == (
        'Error: approval for tool "word_count" was cancelled'
    )
    code, info = await refused(resolve(e2e, "c1", requested.approval_id, ALLOW))
    assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "APPROVAL_RESOLVED")
    # The next turn works (the script ran out: it echoes, with a tool round trip).
    await e2e.agents.WaitIdle(api.WaitIdleRequest(agent_id="c1"), timeout=T)
    check_log(await all_events(e2e, "c1"))


async def test_disposal_cancels_a_pending_approval(e2e: E2E) -> None:
    await create(e2e, "d1", approval_options(*WORD_COUNT_THEN_DONE))
    start = await send(e2e, "d1")
    with EventStream(e2e.agents, agent_id="d1", from_seq=start) as stream:
        await stream.until("approval_requested")
        await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="d1"), timeout=T)
        end = await stream.until("turn_end")
    assert end.turn_end.reason.WhichOneof("kind") == "disposed"
    (resolved,) = of_kind(stream.events, "approval_resolved")
    assert resolved.approval_resolved.outcome == approval_pb2.APPROVAL_OUTCOME_CANCELLED


async def test_a_listener_ask_waits_and_names_who_asked(e2e: E2E) -> None:
    from agentloop.v1 import decision_pb2

    def ask_for_echo(
        exec: ToolExecution, next_: S.Next[ToolExecution, decision_pb2.PreToolDecision]
    ) -> decision_pb2.PreToolDecision | Awaitable[decision_pb2.PreToolDecision]:
        if exec.name == "echo":
            return decision_pb2.PreToolDecision(ask=decision_pb2.ToolAsk(reason="echo is loud"))
        return next_()

    e2e.app.runtime.seams.on(S.TOOLS_PRE_EXECUTE, ask_for_echo, name="asker")
    options = approval_options(
        step_calling(("e1", "echo", {"text": "hi"})),
        scripted_pb2.ScriptedStep(text="ok"),
        tools=("echo",),
        required=(),
    )
    await create(e2e, "l1", options)
    start = await send(e2e, "l1")
    with EventStream(e2e.agents, agent_id="l1", from_seq=start) as stream:
        requested = (await stream.until("approval_requested")).approval_requested
        assert (requested.reason, requested.requested_by) == ("echo is loud", "tools/pre-execute")
        await resolve(e2e, "l1", requested.approval_id, ALLOW)
        await stream.until("turn_end")
    (result,) = of_kind(stream.events, "tool_result")
    assert text_of(result.tool_result.content) == "hi"


# -- refusals ------------------------------------------------------------------------------


async def test_wrong_ids_second_answers_and_retries_get_precise_statuses(e2e: E2E) -> None:
    await create(e2e, "s1", approval_options(*WORD_COUNT_THEN_DONE))
    start = await send(e2e, "s1")
    with EventStream(e2e.agents, agent_id="s1", from_seq=start) as stream:
        requested = (await stream.until("approval_requested")).approval_requested
        before = len(await all_events(e2e, "s1"))

        code, info = await refused(resolve(e2e, "s1", "ap-nope", ALLOW))
        assert (code, info.reason) == (grpc.StatusCode.NOT_FOUND, "APPROVAL_NOT_FOUND")
        assert info.metadata["approval_id"] == "ap-nope"
        code, info = await refused(resolve(e2e, "s1", requested.approval_id, 0))
        assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
        code, info = await refused(resolve(e2e, "s1", requested.approval_id, ALLOW, "why"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and info.metadata["field"] == "reason"
        code, info = await refused(resolve(e2e, "nobody", requested.approval_id, ALLOW))
        assert (code, info.reason) == (grpc.StatusCode.NOT_FOUND, "AGENT_NOT_FOUND")
        assert len(await all_events(e2e, "s1")) == before  # nothing changed

        first = await resolve(e2e, "s1", requested.approval_id, ALLOW, rid="r-1")
        retry = await resolve(e2e, "s1", requested.approval_id, ALLOW, rid="r-1")
        assert retry == first  # an idempotent retry: the first answer
        code, info = await refused(resolve(e2e, "s1", requested.approval_id, REJECT))
        assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "APPROVAL_RESOLVED")
        assert info.metadata["resolved_by"] == "api"
        assert info.metadata["outcome"] == "APPROVAL_OUTCOME_ALLOWED_ONCE"
        await stream.until("turn_end")
    events = await all_events(e2e, "s1")
    (resolved,) = of_kind(events, "approval_resolved")
    assert resolved.approval_resolved.request_id == "r-1"
    check_log(events)


async def test_agent_options_approval_timeout_is_checked(e2e: E2E) -> None:
    options = approval_options(timeout_ms=0)
    code, info = await refused(
        e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="bad", options=options), timeout=T)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.metadata["field"] == "options.approval_timeout"


async def test_approvals_turned_off_deny_an_ask_at_once() -> None:
    config = Config(listen="127.0.0.1:0", store="memory", agents=(), approval_timeout_seconds=0)
    async with running_app(config) as e2e:
        await create(e2e, "off", approval_options(*WORD_COUNT_THEN_DONE))
        events = await read_turn(e2e.agents, "off", await send(e2e, "off"))
    assert "approval_requested" not in kinds(events)
    (result,) = of_kind(events, "tool_result")
    assert text_of(result.tool_result.content) == (
        'Error: tool "word_count" requires approval (no approval channel is available)'
    )


# -- parallel calls ------------------------------------------------------------------------


async def test_a_waiting_call_holds_only_its_slot_and_results_commit_in_model_order(
    e2e: E2E,
) -> None:
    finished: list[str] = []
    other_done = asyncio.Event()

    async def record(exec: ToolExecution, next_: S.Next[ToolExecution, ToolOutcome]) -> ToolOutcome:
        outcome = await next_()
        finished.append(exec.call_id)
        if exec.call_id == "p2":
            other_done.set()
        return outcome

    e2e.app.runtime.seams.on(S.TOOLS_EXECUTE, record, name="recorder")
    options = approval_options(
        step_calling(("p1", "word_count", {"text": "a b"}), ("p2", "current_time", {})),
        scripted_pb2.ScriptedStep(text="both"),
        tools=("word_count", "current_time"),
    )
    await create(e2e, "par", options)
    start = await send(e2e, "par")
    with EventStream(e2e.agents, agent_id="par", from_seq=start) as stream:
        requested = (await stream.until("approval_requested")).approval_requested
        assert requested.call_id == "p1"
        # The second call ran to completion while the first one waits.
        async with asyncio.timeout(T):
            await other_done.wait()
        assert finished == ["p2"]
        assert "tool_result" not in kinds(stream.events)  # p2 waits behind p1 to commit
        await resolve(e2e, "par", requested.approval_id, ALLOW)
        await stream.until("turn_end")
    assert finished == ["p2", "p1"]
    results = [e.tool_result.call_id for e in of_kind(stream.events, "tool_result")]
    assert results == ["p1", "p2"]  # model order
    check_log(await all_events(e2e, "par"))


# -- approver plugins ----------------------------------------------------------------------

PY_APPROVER = REPO / "clients" / "python" / "examples" / "approver_plugin.py"
NODE_APPROVER = REPO / "clients" / "node" / "examples" / "approver-plugin.js"


def approver(lang: str, *flags: str) -> list[str]:
    if lang == "python":
        return [sys.executable, str(PY_APPROVER), *flags]
    return [node(), str(NODE_APPROVER), *flags]


async def register(e2e: E2E, address: str) -> None:
    await e2e.registry.RegisterPlugin(reg.RegisterPluginRequest(address=address), timeout=T)


@pytest.mark.parametrize("lang", ["python", "node"])
async def test_an_approver_plugin_answers(e2e: E2E, launcher: PluginLauncher, lang: str) -> None:
    plugin = await launcher.start(approver(lang, "--reject", "word_count", "--reason", "not today"))
    await register(e2e, plugin.address)
    await create(e2e, "p-" + lang, approval_options(*WORD_COUNT_THEN_DONE))
    events = await read_turn(e2e.agents, "p-" + lang, await send(e2e, "p-" + lang))
    (resolved,) = of_kind(events, "approval_resolved")
    assert resolved.approval_resolved.outcome == approval_pb2.APPROVAL_OUTCOME_REJECTED
    assert resolved.approval_resolved.resolved_by == f"plugin:{plugin.name}"
    (result,) = of_kind(events, "tool_result")
    assert text_of(result.tool_result.content) == (
        'Error: the user rejected tool "word_count": not today'
    )
    line = await plugin.line()
    assert line.startswith("reject ap-") and line.endswith(" word_count")


@pytest.mark.parametrize("lang", ["python", "node"])
async def test_an_approver_plugin_allows_and_the_api_loses_clearly(
    e2e: E2E, launcher: PluginLauncher, lang: str
) -> None:
    plugin = await launcher.start(approver(lang, "--allow", "word_count"))
    await register(e2e, plugin.address)
    agent_id = "race-" + lang
    await create(e2e, agent_id, approval_options(*WORD_COUNT_THEN_DONE))
    start = await send(e2e, agent_id)
    with EventStream(e2e.agents, agent_id=agent_id, from_seq=start) as stream:
        requested = (await stream.until("approval_requested")).approval_requested
        # The API answers as soon as it sees the request: a real race with the plugin.
        try:
            answer = await resolve(e2e, agent_id, requested.approval_id, REJECT, "api says no")
            api_won = True
        except grpc.aio.AioRpcError as error:
            api_won = False
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"by plugin:{plugin.name}" in (error.details() or "")
        await stream.until("turn_end")
    (resolved,) = of_kind(stream.events, "approval_resolved")  # one winner
    (result,) = of_kind(stream.events, "tool_result")
    if api_won:
        assert answer.resolution.resolved_by == "api"
        assert resolved.approval_resolved.resolved_by == "api"
        assert text_of(result.tool_result.content).startswith("Error: the user rejected")
    else:
        assert resolved.approval_resolved.resolved_by == f"plugin:{plugin.name}"
        assert text_of(result.tool_result.content) == "3 words"
    # Either way a later answer is refused and names the winner.
    code, info = await refused(resolve(e2e, agent_id, requested.approval_id, ALLOW))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert info.metadata["resolved_by"] == resolved.approval_resolved.resolved_by
    check_log(await all_events(e2e, agent_id))


async def test_an_answer_says_where_it_was_given_and_a_bad_word_is_refused(e2e: E2E) -> None:
    await create(e2e, "via", approval_options(*WORD_COUNT_THEN_DONE))
    start = await send(e2e, "via")
    with EventStream(e2e.agents, agent_id="via", from_seq=start) as stream:
        requested = (await stream.until("approval_requested")).approval_requested
        for bad in ("Console", "con sole", "x" * 33):
            code, info = await refused(
                e2e.agents.ResolveApproval(
                    api.ResolveApprovalRequest(
                        agent_id="via", approval_id=requested.approval_id, decision=ALLOW, via=bad
                    ),
                    timeout=T,
                )
            )
            assert (code, info.metadata["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "via")
        # Refused, it changed nothing: the approval still waits, answered from the console.
        answer = await e2e.agents.ResolveApproval(
            api.ResolveApprovalRequest(
                agent_id="via", approval_id=requested.approval_id, decision=ALLOW, via="console"
            ),
            timeout=T,
        )
        await stream.until("turn_end")
    assert answer.resolution.resolved_by == "api:console"
    (resolved,) = of_kind(stream.events, "approval_resolved")
    assert resolved.approval_resolved.resolved_by == "api:console"
    (result,) = of_kind(stream.events, "tool_result")
    assert text_of(result.tool_result.content) == "3 words"


async def test_an_abstaining_plugin_leaves_the_answer_to_the_api(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(approver("python", "--allow", "sleep"))
    await register(e2e, plugin.address)
    await create(e2e, "abst", approval_options(*WORD_COUNT_THEN_DONE))
    start = await send(e2e, "abst")
    with EventStream(e2e.agents, agent_id="abst", from_seq=start) as stream:
        requested = (await stream.until("approval_requested")).approval_requested
        answer = await resolve(e2e, "abst", requested.approval_id, ALLOW)
        await stream.until("turn_end")
    assert answer.resolution.resolved_by == "api"
    (result,) = of_kind(stream.events, "tool_result")
    assert text_of(result.tool_result.content) == "3 words"


# -- a crash while waiting -----------------------------------------------------------------


async def test_sigkill_while_waiting_then_resume(tmp_path: Path) -> None:
    from tests.e2e.test_durability import (
        create as create_stored,
    )
    from tests.e2e.test_durability import (
        list_events,
        resume,
        run_next_turn,
        running_server,
        word_count_options,
    )

    async with running_server(tmp_path) as server:
        session_id = await create_stored(server, "k1", approval_options(*WORD_COUNT_THEN_DONE))
        sent = await server.agents.SendMessage(
            api.SendMessageRequest(agent_id="k1", text="count"), timeout=T
        )
        with EventStream(server.agents, agent_id="k1", from_seq=sent.next_seq) as stream:
            requested = (await stream.until("approval_requested")).approval_requested
            seen = list(stream.events)
        await server.crash()

    async with running_server(tmp_path) as server:
        await resume(server, "back", session_id, word_count_options())
        reloaded = await list_events(server, session_id)
        tail = reloaded[seen[-1].seq :]
        # The turn is closed as interrupted; the approval was never answered.
        assert kinds(tail) == ["tool_result", "step_end", "turn_end"]
        assert tail[0].tool_result.call_id == requested.call_id
        assert tail[0].tool_result.error.code == "interrupted"
        assert tail[-1].turn_end.reason.WhichOneof("kind") == "interrupted"
        assert not of_kind(reloaded, "approval_resolved")
        check_log(reloaded)
        listed = await server.agents.ListApprovals(
            api.ListApprovalsRequest(agent_id="back"), timeout=T
        )
        assert not listed.approvals
        code, info = await refused(
            server.agents.ResolveApproval(
                api.ResolveApprovalRequest(
                    agent_id="back", approval_id=requested.approval_id, decision=ALLOW
                ),
                timeout=T,
            )
        )
        assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "APPROVAL_STALE")
        assert len(await list_events(server, session_id)) == len(reloaded)  # nothing changed
        # The next turn works.
        await run_next_turn(
            server, "back", session_id, "again", turn=2, first_seq=len(reloaded) + 1
        )
        await server.terminate()


async def test_the_python_client_lists_and_resolves_approvals(e2e: E2E) -> None:
    from agentloop.client import connect

    client = connect(e2e.target)
    try:
        await client.create("sdk", approval_options(*WORD_COUNT_THEN_DONE))
        turn = await client.send("sdk", "count")
        events = turn.events()
        async with asyncio.timeout(T):
            async for event in events:
                if event.HasField("approval_requested"):
                    break
        (pending,) = await client.approvals("sdk")
        assert pending == event.approval_requested
        resolution = await client.resolve_approval(
            "sdk", pending.approval_id, allow=False, reason="no"
        )
        assert resolution.outcome == approval_pb2.APPROVAL_OUTCOME_REJECTED
        async with asyncio.timeout(T):
            rest = [e async for e in events]
        assert rest[-1].HasField("turn_end") and not await client.approvals("sdk")
    finally:
        await client.close()


# -- the README's round trips, run as written ----------------------------------------------


def readme_block(first_line: str) -> str:
    """The README's shell block that starts with `first_line`."""
    readme = (REPO / "README.md").read_text()
    for block in readme.split("```sh\n")[1:]:
        body = block.split("```", 1)[0]
        if body.startswith(first_line + "\n"):
            return body
    raise AssertionError(f"no README block starts with {first_line!r}")


async def run_script(script: str, address: str) -> str:
    env = {**os.environ, "AGENTLOOP_ADDRESS": address, "NO_COLOR": "1"}
    env.pop("AGENTLOOP_TOKEN", None)
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", "set -e\n" + script.replace("127.0.0.1:50051", address),
        cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(T * 3):
            stdout, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
    assert process.returncode == 0, stderr.decode() + stdout.decode()
    return stdout.decode()


@pytest.mark.parametrize(
    ("first_line", "agent_id", "answered_by"),
    [
        ("# Approval round trip with grpcurl", "careful", "api"),
        ("# Approval round trip with the CLI", "careful-cli", "api:cli"),  # the CLI says so
    ],
)
async def test_the_readme_approval_round_trips_run_as_written(
    e2e: E2E, first_line: str, agent_id: str, answered_by: str
) -> None:
    output = await run_script(readme_block(first_line), e2e.target)
    events = await all_events(e2e, agent_id)
    check_log(events)
    (resolved,) = of_kind(events, "approval_resolved")
    assert resolved.approval_resolved.outcome == approval_pb2.APPROVAL_OUTCOME_ALLOWED_ONCE
    assert resolved.approval_resolved.resolved_by == answered_by
    (result,) = of_kind(events, "tool_result")
    assert text_of(result.tool_result.content) == "3 words"
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    assert resolved.approval_resolved.approval_id in output


async def test_a_plugin_ask_names_the_plugin_and_waits(e2e: E2E, launcher: PluginLauncher) -> None:
    plugin = await launcher.start(
        configurable("python", "--name", "asker", "--ask-tool", "echo", "--ask-reason", "loud")
    )
    await register(e2e, plugin.address)
    options = approval_options(
        step_calling(("e1", "echo", {"text": "hi"})),
        scripted_pb2.ScriptedStep(text="ok"),
        tools=("echo",),
        required=(),
    )
    await create(e2e, "pa", options)
    start = await send(e2e, "pa")
    with EventStream(e2e.agents, agent_id="pa", from_seq=start) as stream:
        requested = (await stream.until("approval_requested")).approval_requested
        assert (requested.reason, requested.requested_by) == ("loud", "plugin:asker")
        await resolve(e2e, "pa", requested.approval_id, ALLOW)
        await stream.until("turn_end")
    (result,) = of_kind(stream.events, "tool_result")
    assert text_of(result.tool_result.content) == "hi"


@pytest.mark.parametrize(
    ("outer", "requested_by"),
    [("passes on", "plugin:asker"), ("asks itself", "tools/pre-execute")],
)
async def test_who_asked_is_the_listener_whose_ask_the_chain_returned(
    e2e: E2E, launcher: PluginLauncher, outer: str, requested_by: str
) -> None:
    """An in-process listener outside the plugin's: passing its ask on keeps the plugin
    named; answering with an ask of its own names the in-process listener."""
    from agentloop.v1 import decision_pb2

    plugin = await launcher.start(
        configurable("python", "--name", "asker", "--ask-tool", "echo", "--ask-reason", "loud")
    )
    await register(e2e, plugin.address)

    async def outside(
        exec: ToolExecution, next_: S.Next[ToolExecution, decision_pb2.PreToolDecision]
    ) -> decision_pb2.PreToolDecision:
        inner = await next_()
        assert inner.ask.reason == "loud"  # the plugin's ask reached it
        if outer == "passes on":
            return inner
        return decision_pb2.PreToolDecision(ask=decision_pb2.ToolAsk(reason="loud"))

    dispose = e2e.app.runtime.seams.on(S.TOOLS_PRE_EXECUTE, outside, order=-1, name="outside")
    try:
        options = approval_options(
            step_calling(("e1", "echo", {"text": "hi"})),
            scripted_pb2.ScriptedStep(text="ok"),
            tools=("echo",),
            required=(),
        )
        agent_id = "who-" + outer.replace(" ", "-")
        await create(e2e, agent_id, options)
        start = await send(e2e, agent_id)
        with EventStream(e2e.agents, agent_id=agent_id, from_seq=start) as stream:
            requested = (await stream.until("approval_requested")).approval_requested
            assert (requested.reason, requested.requested_by) == ("loud", requested_by)
            await resolve(e2e, agent_id, requested.approval_id, ALLOW)
            await stream.until("turn_end")
    finally:
        dispose()
    (result,) = of_kind(stream.events, "tool_result")
    assert text_of(result.tool_result.content) == "hi"


async def test_a_plugin_that_loses_is_withdrawn_with_the_winner_named(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(configurable("node", "--name", "waiter", "--approver-wait"))
    await register(e2e, plugin.address)
    await create(e2e, "lose", approval_options(*WORD_COUNT_THEN_DONE))
    start = await send(e2e, "lose")
    with EventStream(e2e.agents, agent_id="lose", from_seq=start) as stream:
        requested = (await stream.until("approval_requested")).approval_requested
        await resolve(e2e, "lose", requested.approval_id, ALLOW)
        await stream.until("turn_end")
    line = await plugin.line()
    assert line == f"withdrawn {requested.approval_id}: approval already resolved by api"
