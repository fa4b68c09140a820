"""Token accounting and compaction through a real server: manual, automatic, on overflow.

The history a client derives from the log (applying each event's surface op, written
here independently of the server), the history the server derives after a restart,
a fork's, and what a real HTTP provider receives all agree after a compaction.
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from agentloop.plugin import sdk
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.models.scripted_options import script_options
from server.settings.config import Config, load_config
from tests.e2e.conftest import (
    E2E,
    Client,
    EventStream,
    kinds,
    of_kind,
    read_turn,
    running_app,
    text_of,
)
from tests.e2e.registry import register, unregister
from tests.e2e.test_approvals import readme_block, run_script
from tests.e2e.test_durability import running_server
from tests.fake_openai import Event, FakeOpenAI, Reply, chunk, text, usage
from tests.invariants import check_log
from tests.plugin_client import serving
from tests.processes import REPO, PluginLauncher, grpcurl, node

T = 10.0

TURNS = 200
"""Turns of the small-window agent: several compactions' worth."""

SURFACE = {
    "user_message": lambda e: text_of(e.user_message.content),
    "assistant_message": lambda e: text_of(e.assistant_message.content),
    "tool_result": lambda e: text_of(e.tool_result.content),
    "context_message": lambda e: (
        text_of(e.context_message.content)
        if e.context_message.envelope == ev.CONTEXT_ENVELOPE_RAW
        else f'<context source="{e.context_message.source.kind}">\n'
        f"{text_of(e.context_message.content)}\n</context>"
    ),
    "steering_message": lambda e: text_of(e.steering_message.content),
}


def client_history(events: Sequence[ev.SessionEvent]) -> list[str]:
    """The history's texts as a client derives them: append, or replace start..end."""
    nodes: list[str | None] = []
    for event in events:
        kind = event.WhichOneof("payload")
        if kind not in SURFACE:
            continue
        anchor = kind == "assistant_message" and not event.assistant_message.content
        node = None if anchor else SURFACE[kind](event)  # an anchor: a node, no message
        op = event.surface_op
        if op.kind == ev.SURFACE_OP_KIND_REPLACE:
            nodes[op.start : op.end + 1] = [node]
        else:
            nodes.append(node)
    return [n for n in nodes if n is not None]


def server_history(e2e: E2E, agent_id: str) -> list[str]:
    """The history the server's live agent holds (what its next request sends)."""
    agent = e2e.app.factory.get(agent_id)
    return [
        text_of(m.content) + "".join(text_of(b.tool_result.content) for b in m.content)
        for m in agent.session.derive_messages()
    ]


async def all_events(e2e: Client, *, agent_id: str) -> list[ev.SessionEvent]:
    """The whole stored log, page after page."""
    events: list[ev.SessionEvent] = []
    token = ""
    while True:
        listed = await e2e.agents.ListSessionEvents(
            api.ListSessionEventsRequest(page_size=5000, agent_id=agent_id, page_token=token),
            timeout=T,
        )
        events.extend(listed.events)
        token = listed.next_page_token
        if not token:
            return events


async def turn(e2e: E2E, agent_id: str, message: str) -> list[ev.SessionEvent]:
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id=agent_id, text=message), timeout=T
    )
    events = await read_turn(e2e.agents, agent_id, sent.next_seq)
    await e2e.agents.WaitIdle(api.WaitIdleRequest(agent_id=agent_id), timeout=T)
    return events


def sqlite_config(data: Path) -> Config:
    return Config(listen="127.0.0.1:0", store="sqlite", data_dir=str(data), agents=())


async def create(e2e: E2E, agent_id: str, options: agent_pb2.AgentOptions) -> str:
    created = await e2e.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id=agent_id, options=options), timeout=T
    )
    return created.agent.session_id


def scripted(steps: Sequence[scripted_pb2.ScriptedStep]) -> agent_pb2.AgentOptions:
    return agent_pb2.AgentOptions(provider="scripted", provider_options=script_options(steps))


# -- 1. token accounting -----------------------------------------------------------------


async def test_get_agent_and_live_events_report_context_used_against_the_window(
    e2e: E2E,
) -> None:
    options = agent_pb2.AgentOptions(provider="scripted", context_window_tokens=50_000)
    await create(e2e, "gauge", options)
    described = await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id="gauge"), timeout=T)
    empty = described.agent.context_usage
    assert (empty.window_tokens, empty.reserve_tokens) == (50_000, 12_500)  # a quarter at most
    assert (empty.compact_at_tokens, empty.keep_recent_tokens) == (37_500, 12_500)
    assert empty.used_tokens == 0 and empty.estimated
    with EventStream(e2e.agents, agent_id="gauge") as stream:
        events = await turn(e2e, "gauge", "hello there " * 40)
        live = await stream.until_agent_event(lambda a: a.HasField("context_usage"))
    reported = of_kind(events, "assistant_message")[-1].assistant_message.usage
    assert reported.input_tokens > 100  # the scripted model reports characters / 4
    described = await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id="gauge"), timeout=T)
    gauge = described.agent.context_usage
    # The provider's report of the last step, nothing appended since: not an estimate.
    assert gauge.used_tokens == reported.input_tokens + reported.output_tokens
    assert not gauge.estimated
    assert live.context_usage == gauge


async def test_an_unknown_window_reports_usage_but_never_compacts(e2e: E2E) -> None:
    await create(e2e, "plain", agent_pb2.AgentOptions(provider="scripted"))
    await turn(e2e, "plain", "one")
    described = await e2e.factory.GetAgent(fac.GetAgentRequest(agent_id="plain"), timeout=T)
    gauge = described.agent.context_usage
    assert gauge.used_tokens > 0
    assert (gauge.window_tokens, gauge.compact_at_tokens) == (0, 0)


async def test_context_options_out_of_range_are_refused_naming_the_field(e2e: E2E) -> None:
    for options, field in [
        (agent_pb2.AgentOptions(context_window_tokens=100), "options.context_window_tokens"),
        (agent_pb2.AgentOptions(keep_recent_tokens=10**9), "options.keep_recent_tokens"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await e2e.factory.CreateAgent(
                fac.CreateAgentRequest(agent_id="bad", options=options), timeout=T
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (refused.value.details() or "")


# -- 2. manual compaction ----------------------------------------------------------------


async def test_manual_compaction_is_one_replace_event_every_reader_agrees_on(
    tmp_path: Path,
) -> None:
    options = agent_pb2.AgentOptions(provider="scripted")
    async with running_app(sqlite_config(tmp_path)) as e2e:
        session_id = await create(e2e, "keeper", options)
        for word in ("alpha", "bravo", "charlie"):
            await turn(e2e, "keeper", f"remember {word}")
        before = await all_events(e2e, agent_id="keeper")
        assert client_history(before) == server_history(e2e, "keeper")
        last_end_before = of_kind(before, "turn_end")[-1].seq
        request = api.CompactAgentRequest(
            agent_id="keeper", request_id="c-1", instructions="the words", keep_recent_tokens=15
        )
        with EventStream(e2e.agents, agent_id="keeper", from_seq=len(before) + 1) as stream:
            answer = await e2e.agents.CompactAgent(request, timeout=T)
            started = await stream.until_agent_event(lambda a: a.HasField("compaction"))
            finished = await stream.until_agent_event(lambda a: a.HasField("compaction"))
        assert answer.compacted, answer.reason
        assert started.compaction.phase == ae.COMPACTION_PHASE_STARTED
        assert finished.compaction.phase == ae.COMPACTION_PHASE_FINISHED
        assert finished.compaction.event_seq == answer.event_seq
        after = await all_events(e2e, agent_id="keeper")
        added = after[len(before) :]
        assert kinds(added) == ["turn_start", "context_message", "turn_end"]
        assert added[0].turn_start.trigger == ev.TRIGGER_KIND_COMPACTION
        summary = added[1]
        assert summary.seq == answer.event_seq
        assert summary.surface_op.kind == ev.SURFACE_OP_KIND_REPLACE
        info = summary.context_message.compaction
        assert info == answer.compaction
        assert info.trigger == ev.COMPACTION_TRIGGER_MANUAL
        assert info.instructions == "the words" and info.request_id == "c-1"
        assert info.first_seq == of_kind(before, "user_message")[0].seq
        assert info.tokens_after < info.tokens_before
        # The last turn (its prompt and answer) is kept; the two before are summarised.
        history = client_history(after)
        assert history == server_history(e2e, "keeper")
        assert len(history) == 3
        assert history[0].startswith('<context source="compaction">')
        assert "The user said: remember alpha | remember bravo." in history[0]
        assert "Focus: the words." in history[0]
        assert history[1:] == ["remember charlie", "You said: remember charlie"]
        check_log(after)
        # A retry with the same request id answers the same and compacts nothing more.
        again = await e2e.agents.CompactAgent(request, timeout=T)
        assert again == answer
        assert len(await all_events(e2e, agent_id="keeper")) == len(after)
        # The next turn's request is the summary, the kept turn and the new prompt.
        await turn(e2e, "keeper", "delta")
        assert server_history(e2e, "keeper")[:3] == history
        final = await all_events(e2e, agent_id="keeper")
        # Forks before and after the compaction are whole.
        fork_before = await e2e.agents.ForkSession(
            api.ForkSessionRequest(session_id=session_id, boundary_seq=last_end_before), timeout=T
        )
        fork_after = await e2e.agents.ForkSession(
            api.ForkSessionRequest(session_id=session_id), timeout=T
        )
    # A restart: the resumed agent replays the log to the same history; so do the forks.
    async with running_app(sqlite_config(tmp_path)) as e2e:
        await e2e.factory.ResumeAgent(
            fac.ResumeAgentRequest(agent_id="keeper", session_id=session_id, options=options),
            timeout=T,
        )
        assert server_history(e2e, "keeper") == client_history(final)
        for fork, expected in ((fork_before, before), (fork_after, final)):
            agent_id = f"fork-{fork.session.session_id[-8:]}"
            await e2e.factory.ResumeAgent(
                fac.ResumeAgentRequest(
                    agent_id=agent_id, session_id=fork.session.session_id, options=options
                ),
                timeout=T,
            )
            assert server_history(e2e, agent_id) == client_history(expected)


async def test_compaction_is_refused_while_a_turn_runs_and_checks_its_fields(e2e: E2E) -> None:
    slow = scripted_pb2.ScriptedStep(text="slow answer", chunk_size=1)
    slow.chunk_delay.FromMilliseconds(50)
    await create(e2e, "busy", scripted([slow]))
    await e2e.agents.SendMessage(api.SendMessageRequest(agent_id="busy", text="go"), timeout=T)
    with pytest.raises(grpc.aio.AioRpcError) as running:
        await e2e.agents.CompactAgent(api.CompactAgentRequest(agent_id="busy"), timeout=T)
    assert running.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "running a turn" in (running.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as too_long:
        await e2e.agents.CompactAgent(
            api.CompactAgentRequest(agent_id="busy", instructions="x" * 20_000), timeout=T
        )
    assert too_long.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "instructions" in (too_long.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await e2e.agents.CompactAgent(api.CompactAgentRequest(agent_id="nobody"), timeout=T)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    await e2e.agents.WaitIdle(api.WaitIdleRequest(agent_id="busy"), timeout=T)
    # Nothing older than the recent history: answered, nothing recorded.
    count = len(await all_events(e2e, agent_id="busy"))
    kept = await e2e.agents.CompactAgent(
        api.CompactAgentRequest(agent_id="busy", keep_recent_tokens=1_000_000), timeout=T
    )
    assert not kept.compacted and "nothing older" in kept.reason
    assert len(await all_events(e2e, agent_id="busy")) == count


# -- 3. automatic compaction -------------------------------------------------------------


@pytest.mark.parametrize("tools", [[], ["word_count"]], ids=["text", "tools"])
async def test_a_small_window_agent_lives_through_many_turns_compacting_as_configured(
    e2e: E2E, tools: list[str]
) -> None:
    options = agent_pb2.AgentOptions(
        provider="scripted", context_window_tokens=2048, keep_recent_tokens=300, tools=tools
    )
    await create(e2e, "small", options)
    compact_at = 2048 - 2048 // 4
    with EventStream(e2e.agents, agent_id="small") as stream:
        for i in range(TURNS):
            events = await turn(e2e, "small", f"turn {i}: " + "lorem ipsum dolor " * 20)
            assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
            for message in of_kind(events, "assistant_message"):
                # Every request the model got stayed within the window.
                assert message.assistant_message.usage.input_tokens < 2048
        seen = await stream.until_agent_event(lambda a: a.HasField("compaction"))
    assert seen.compaction.trigger == ev.COMPACTION_TRIGGER_THRESHOLD
    log = await all_events(e2e, agent_id="small")
    summaries = [e for e in of_kind(log, "context_message") if e.context_message.compaction.trigger]
    assert len(summaries) >= 3
    for summary in summaries:
        info = summary.context_message.compaction
        assert info.trigger == ev.COMPACTION_TRIGGER_THRESHOLD
        assert info.tokens_before > compact_at
        assert info.tokens_after < info.tokens_before
    # Compacting happens before a step, inside the turn, never under a tool batch.
    for summary in summaries:
        position = log.index(summary)
        assert log[position + 1].WhichOneof("payload") == "step_start"
    assert client_history(log) == server_history(e2e, "small")
    # The kept part never starts at a tool result: every result follows its call.
    history = e2e.app.factory.get("small").session.derive_messages()
    calls: set[str] = set()
    for entry in history:
        for block in entry.content:
            if block.WhichOneof("block") == "tool_call":
                calls.add(block.tool_call.id)
            if block.WhichOneof("block") == "tool_result":
                assert block.tool_result.tool_call_id in calls
    check_log(log)


async def test_a_resume_replays_from_the_last_compaction_to_the_same_history(
    tmp_path: Path,
) -> None:
    options = agent_pb2.AgentOptions(
        provider="scripted", context_window_tokens=2048, keep_recent_tokens=300
    )
    async with running_app(sqlite_config(tmp_path)) as e2e:
        session_id = await create(e2e, "long", options)
        for i in range(40):
            await turn(e2e, "long", f"turn {i}: " + "lorem ipsum dolor " * 20)
        log = await all_events(e2e, agent_id="long")
        summaries = [e for e in of_kind(log, "context_message") if e.context_message.compaction]
        assert len(summaries) >= 2
        history = server_history(e2e, "long")
        assert client_history(log) == history
        # Forks before the last compaction (an earlier one in it) and after it.
        end_before = [e for e in of_kind(log, "turn_end") if e.seq < summaries[-1].seq][-1]
        fork_before = await e2e.agents.ForkSession(
            api.ForkSessionRequest(session_id=session_id, boundary_seq=end_before.seq), timeout=T
        )
        fork_after = await e2e.agents.ForkSession(
            api.ForkSessionRequest(session_id=session_id), timeout=T
        )
    async with running_app(sqlite_config(tmp_path)) as e2e:
        await e2e.factory.ResumeAgent(
            fac.ResumeAgentRequest(agent_id="long", session_id=session_id, options=options),
            timeout=T,
        )
        # The resume read the log from the last summary's kept part only...
        last = summaries[-1].context_message.compaction
        assert e2e.app.factory.get("long").session.first_seq == last.last_seq + 1
        # ...to the same history; the whole log stays readable.
        assert server_history(e2e, "long") == history
        assert await all_events(e2e, agent_id="long") == log
        # The header in force came back with the summary: the next request logs a resume.
        events = await turn(e2e, "long", "after the restart")
        logged = of_kind(events, "request_header")
        assert [e.request_header.reason for e in logged] == [ev.HEADER_REASON_RESUME]
        assert (
            logged[0].request_header.header
            == of_kind(log, "request_header")[-1].request_header.header
        )
        assert server_history(e2e, "long") == client_history(await all_events(e2e, agent_id="long"))
        for fork, expected in ((fork_before, log[: end_before.seq]), (fork_after, log)):
            agent_id = f"fork-{fork.session.session_id[-8:]}"
            await e2e.factory.ResumeAgent(
                fac.ResumeAgentRequest(
                    agent_id=agent_id, session_id=fork.session.session_id, options=options
                ),
                timeout=T,
            )
            assert server_history(e2e, agent_id) == client_history(expected)
            assert e2e.app.factory.get(agent_id).session.first_seq > 1


# -- 4. overflow from a provider ---------------------------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


OVERFLOW = Reply(
    status=400,
    body={
        "error": {
            "message": "This model's maximum context length is 1000 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    },
)


def fake_config(tmp_path: Path, fake: FakeOpenAI) -> Config:
    config_file = tmp_path / "agentloop.yaml"
    config_file.write_text(
        "listen: 127.0.0.1:0\nstore: memory\nproviders:\n  - name: fake\n"
        f"    baseUrl: {fake.base_url}\n    defaultModel: gpt-test\n    maxAttempts: 1\n"
    )
    return load_config(config_file)


async def test_an_overflow_compacts_and_retries_once_then_a_clear_error(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(
        Reply(events=[*text("first answer"), usage(40, 3)]),
        Reply(events=[*text("second answer"), usage(60, 3)]),
        OVERFLOW,
        Reply(events=[*text("SUMMARY-ONE"), usage(50, 5)]),
        Reply(events=[*text("third answer"), usage(30, 3)]),
    )
    async with running_app(fake_config(tmp_path, fake)) as e2e:
        await create(e2e, "over", agent_pb2.AgentOptions(provider="fake", keep_recent_tokens=1))
        await turn(e2e, "over", "one")
        await turn(e2e, "over", "two")
        events = await turn(e2e, "over", "three")
        assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
        summary = of_kind(events, "context_message")[0]
        assert summary.context_message.compaction.trigger == ev.COMPACTION_TRIGGER_OVERFLOW
        assert summary.context_message.compaction.usage.input_tokens == 50
        assert text_of(of_kind(events, "assistant_message")[-1].assistant_message.content) == (
            "third answer"
        )
        # The summary request saw the transcript; the retry sent the summary and the prompt.
        refused, summarising, retried = fake.requests[2:5]
        transcript = summarising.body["messages"][-1]["content"]
        assert "[user] one" in transcript and "[assistant] first answer" in transcript
        assert "tools" not in summarising.body
        texts = [str(m["content"]) for m in retried.body["messages"] if m["role"] != "system"]
        assert len(texts) == 2
        assert "SUMMARY-ONE" in texts[0] and texts[1] == "three"
        assert len(retried.body["messages"]) < len(refused.body["messages"])
        assert client_history(await all_events(e2e, agent_id="over")) == server_history(e2e, "over")
        # A provider that still refuses after the compaction: the turn ends `error` and says
        # so; the next turn, once the provider answers, works.
        fake.script(OVERFLOW, Reply(events=[*text("SUMMARY-TWO")]), OVERFLOW)
        failed = await turn(e2e, "over", "four")
        reason = failed[-1].turn_end.reason
        assert reason.WhichOneof("kind") == "error"
        assert reason.error.code == "CONTEXT_LENGTH_EXCEEDED"
        assert "still too long after compacting" in reason.error.message
        fake.script(Reply(events=[*text("fifth answer")]))
        recovered = await turn(e2e, "over", "five")
        assert recovered[-1].turn_end.reason.WhichOneof("kind") == "completed"
        check_log(await all_events(e2e, agent_id="over"))


async def test_a_plugin_style_error_finish_with_the_overflow_code_compacts_too(e2e: E2E) -> None:
    script = [
        scripted_pb2.ScriptedStep(text="a1"),
        scripted_pb2.ScriptedStep(
            finish=st.FINISH_KIND_ERROR,
            error_message="context too long",
            error_code="CONTEXT_LENGTH_EXCEEDED",
        ),
        scripted_pb2.ScriptedStep(text="a2"),
    ]
    await create(e2e, "plug", scripted(script))
    await turn(e2e, "plug", "first")
    events = await turn(e2e, "plug", "second")
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed", events[-1]
    summaries = of_kind(events, "context_message")
    assert summaries[0].context_message.compaction.trigger == ev.COMPACTION_TRIGGER_OVERFLOW
    assert text_of(of_kind(events, "assistant_message")[-1].assistant_message.content) == "a2"


# -- the README's grpcurl walk-through ---------------------------------------------------


async def test_the_readme_agent_living_through_its_window(e2e: E2E) -> None:
    output = await run_script(readme_block("# An agent living through its window"), e2e.target)
    lines = output.splitlines()  # the created agent, the summaries' lines, the gauge
    summaries = [line for line in lines if " context_message " in line]
    assert summaries and all("compaction" in line for line in summaries), output
    usage = ast.literal_eval(lines[-1])
    assert int(usage["used_tokens"]) < int(usage["compact_at_tokens"]) == 1536
    log = await all_events(e2e, agent_id="small")
    assert [e.turn_end.reason.WhichOneof("kind") for e in of_kind(log, "turn_end")] == (
        ["completed"] * 12
    )
    infos = [e.context_message.compaction for e in of_kind(log, "context_message")]
    assert len(infos) == len(summaries)
    assert {i.trigger for i in infos} == {ev.COMPACTION_TRIGGER_THRESHOLD}


async def test_the_readme_grpcurl_compaction_walk_through(e2e: E2E) -> None:
    agents, factory = "agentloop.v1.AgentService", "agentloop.v1.AgentFactoryService"
    await grpcurl(
        e2e.target,
        f"{factory}/CreateAgent",
        data={"agent_id": "long", "options": {"context_window_tokens": 32000}},
    )
    for message in ("remember the plan", "and the open bugs"):
        await grpcurl(
            e2e.target, f"{agents}/SendMessage", data={"agent_id": "long", "text": message}
        )
        await grpcurl(e2e.target, f"{agents}/WaitIdle", data={"agent_id": "long"})
    request = {
        "agent_id": "long",
        "instructions": "focus on the open bugs",
        "keep_recent_tokens": 0,
        "request_id": "compact-1",
    }
    answer = json.loads(await grpcurl(e2e.target, f"{agents}/CompactAgent", data=request))
    assert answer["compacted"] is True
    assert answer["compaction"]["trigger"] == "COMPACTION_TRIGGER_MANUAL"
    assert answer["compaction"]["replaced_nodes"] == 4, answer
    described = json.loads(
        await grpcurl(e2e.target, f"{factory}/GetAgent", data={"agent_id": "long"})
    )
    gauge = described["agent"]["context_usage"]
    assert gauge["window_tokens"] == "32000" and gauge["estimated"] is True
    assert server_history(e2e, "long") == [
        '<context source="compaction">\nSummary of the earlier conversation (compacted):\n'
        "Summary of 4 transcript lines. The user said: remember the plan | and the open bugs."
        " Focus: focus on the open bugs.\n</context>"
    ]


# -- a crash during a compaction ---------------------------------------------------------


async def test_sigkill_during_a_compaction_leaves_the_history_as_it_was(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    config = (
        "agents: []\nproviders:\n  - name: fake\n"
        f"    baseUrl: {fake.base_url}\n    defaultModel: gpt-test\n    maxAttempts: 1\n"
    )
    options = agent_pb2.AgentOptions(provider="fake")
    fake.script(
        Reply(events=[*text("first answer")]),
        Reply(events=[*text("second answer")]),
        # The summary never comes: the server is killed while it waits for it.
        Reply(events=[Event(data=chunk({"content": "never"}), delay=60)]),
    )
    async with running_server(tmp_path, config) as server:
        created = await server.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="crash", options=options), timeout=T
        )
        session_id = created.agent.session_id
        for message in ("one", "two"):
            sent = await server.agents.SendMessage(
                api.SendMessageRequest(agent_id="crash", text=message), timeout=T
            )
            await read_turn(server.agents, "crash", sent.next_seq)
            await server.agents.WaitIdle(api.WaitIdleRequest(agent_id="crash"), timeout=T)
        before = await all_events(server, agent_id="crash")
        compacting = asyncio.ensure_future(
            server.agents.CompactAgent(
                api.CompactAgentRequest(agent_id="crash", keep_recent_tokens=0), timeout=30
            )
        )
        await asyncio.wait_for(fake.wait_for_requests(3), T)
        await server.process.kill()
        with pytest.raises(grpc.aio.AioRpcError):
            await compacting
        await server.channel.close()
    fake.script(
        Reply(events=[*text("SUMMARY-AFTER-CRASH")]),
        Reply(events=[*text("third answer")]),
    )
    async with running_server(tmp_path, config) as server:
        await server.factory.ResumeAgent(
            fac.ResumeAgentRequest(agent_id="crash", session_id=session_id, options=options),
            timeout=T,
        )
        resumed = await all_events(server, agent_id="crash")
        # Nothing of the interrupted compaction was stored: the same log, the same history.
        assert resumed == before
        answer = await server.agents.CompactAgent(
            api.CompactAgentRequest(agent_id="crash", keep_recent_tokens=0), timeout=T
        )
        assert answer.compacted
        sent = await server.agents.SendMessage(
            api.SendMessageRequest(agent_id="crash", text="three"), timeout=T
        )
        await read_turn(server.agents, "crash", sent.next_seq)
        final = await all_events(server, agent_id="crash")
    check_log(final)
    request = fake.requests[-1].body["messages"]
    texts = [str(m["content"]) for m in request if m["role"] != "system"]
    assert len(texts) == 2 and "SUMMARY-AFTER-CRASH" in texts[0] and texts[1] == "three"
    assert client_history(final)[0].endswith("SUMMARY-AFTER-CRASH\n</context>")


async def test_a_failed_summary_request_records_nothing_and_says_why(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(
        Reply(events=[*text("first answer")]),
        Reply(status=500, body={"error": {"message": "the summariser is down"}}),
    )
    async with running_app(fake_config(tmp_path, fake)) as e2e:
        await create(e2e, "down", agent_pb2.AgentOptions(provider="fake"))
        await turn(e2e, "down", "one")
        before = await all_events(e2e, agent_id="down")
        with EventStream(e2e.agents, agent_id="down", from_seq=len(before) + 1) as stream:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await e2e.agents.CompactAgent(
                    api.CompactAgentRequest(agent_id="down", keep_recent_tokens=0), timeout=T
                )
            phase = await stream.until_agent_event(
                lambda a: a.compaction.phase == ae.COMPACTION_PHASE_FAILED
            )
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the summariser is down" in (failed.value.details() or "")
        assert "the summariser is down" in phase.compaction.message
        assert await all_events(e2e, agent_id="down") == before
        fake.script(Reply(events=[*text("second answer")]))
        events = await turn(e2e, "down", "two")
        assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"


# -- a compactor plugin ------------------------------------------------------------------


async def test_a_plugin_writes_the_summary_and_its_failure_policy_holds(e2e: E2E) -> None:
    summariser = sdk.Plugin("summariser")
    seen: list[hk.CompactCall] = []

    @summariser.compact()
    async def write(call: hk.HookCall) -> hk.CompactResult:
        seen.append(call.compact)
        texts = [text_of(m.content) for m in call.compact.messages]
        return hk.CompactResult(
            summary=f"PLUGIN: {' / '.join(texts)} ({call.compact.instructions})"
        )

    broken = sdk.Plugin("broken")

    @broken.compact()
    async def fail(call: hk.HookCall) -> hk.CompactResult:
        raise RuntimeError("the store is down")

    await create(e2e, "p", agent_pb2.AgentOptions(provider="scripted"))
    await turn(e2e, "p", "one")
    async with serving(summariser) as address:
        await register(e2e.channel, address)
        answer = await e2e.agents.CompactAgent(
            api.CompactAgentRequest(agent_id="p", instructions="why", keep_recent_tokens=0),
            timeout=T,
        )
        await unregister(e2e.channel, "summariser")
    assert answer.compacted
    assert seen[0].trigger == ev.COMPACTION_TRIGGER_MANUAL and seen[0].tokens_before > 0
    assert not answer.compaction.HasField("usage")  # no model request was made
    assert server_history(e2e, "p") == [
        '<context source="compaction">\nSummary of the earlier conversation (compacted):\n'
        "PLUGIN: one / You said: one (why)\n</context>"
    ]
    await turn(e2e, "p", "two")
    async with serving(broken) as address:
        # FAIL_CLOSED: the compaction fails and the history stays as it was.
        await register(e2e.channel, address, failure_policy=hk.FAILURE_POLICY_FAIL_CLOSED)
        count = len(await all_events(e2e, agent_id="p"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await e2e.agents.CompactAgent(
                api.CompactAgentRequest(agent_id="p", keep_recent_tokens=0), timeout=T
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "broken" in (refused.value.details() or "")
        assert len(await all_events(e2e, agent_id="p")) == count
        await unregister(e2e.channel, "broken")
        # FAIL_OPEN: the failing call is skipped and the agent's model writes the summary.
        await register(e2e.channel, address, failure_policy=hk.FAILURE_POLICY_FAIL_OPEN)
        opened = await e2e.agents.CompactAgent(
            api.CompactAgentRequest(agent_id="p", keep_recent_tokens=0), timeout=T
        )
    assert opened.compacted and opened.compaction.provenance.provider == "scripted"
    assert "Summary of" in server_history(e2e, "p")[0]


PY_COMPACTOR = REPO / "clients" / "python" / "examples" / "compactor_plugin.py"
NODE_COMPACTOR = REPO / "clients" / "node" / "examples" / "compactor-plugin.js"


@pytest.mark.parametrize("lang", ["python", "node"])
async def test_the_example_compactor_plugins_write_the_summary(
    e2e: E2E, launcher: PluginLauncher, lang: str
) -> None:
    argv = (
        [sys.executable, str(PY_COMPACTOR)] if lang == "python" else [node(), str(NODE_COMPACTOR)]
    )
    plugin = await launcher.start([*argv, "--max-chars", "12"])
    await register(e2e.channel, plugin.address)
    agent_id = f"ex-{lang}"
    await create(e2e, agent_id, agent_pb2.AgentOptions(provider="scripted"))
    await turn(e2e, agent_id, "remember the milk please")
    await turn(e2e, agent_id, "and the eggs")
    answer = await e2e.agents.CompactAgent(
        api.CompactAgentRequest(agent_id=agent_id, instructions="shopping", keep_recent_tokens=0),
        timeout=T,
    )
    assert answer.compacted
    assert server_history(e2e, agent_id) == [
        '<context source="compaction">\nSummary of the earlier conversation (compacted):\n'
        "Earlier, the user said:\n- remember the\n- and the eggs\nFocus: shopping\n</context>"
    ]
    assert (await plugin.line()).startswith("summary 4 messages ")
