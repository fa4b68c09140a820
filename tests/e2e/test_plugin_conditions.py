"""Match conditions through a real server and real Python and Node plugin processes.

Per language, one server (metrics on) and one plugin (`tests/plugins/conditioned.*`)
whose subscriptions carry conditions; three agents run the same turns: one the plugin
wants (labelled for it, `team=red`), one of another team, one labelled for no plugin.
The plugin records every call it handles; the server counts every call it skipped.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from agentloop.client import Client
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.models.scripted_options import script_options
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, of_kind, read_turn, running_app, text_of
from tests.e2e.registry import list_plugins, plugin_state, register
from tests.e2e.test_contract import details
from tests.e2e.test_observability import scrape
from tests.processes import TEST_PLUGINS, PluginLauncher, free_port, node, plugin_launcher

pytestmark = pytest.mark.asyncio(loop_scope="module")

T = READ_TIMEOUT
PROMPTS = ("/deploy prod", "/deploy dev", "hello prod")
"""The turns every agent runs: only the first passes the prompt conditions."""


def conditioned(lang: str, *flags: str) -> list[str]:
    """The command line of the conditioned test plugin in `lang` (without --listen)."""
    if lang == "python":
        return [sys.executable, str(TEST_PLUGINS / "conditioned.py"), *flags]
    return [node(), str(TEST_PLUGINS / "conditioned.js"), *flags]


@dataclass
class Run:
    """What one language's scenario left: the records, the turns' user texts, the counts."""

    lang: str
    name: str
    records: list[tuple[str, str, str]]
    user_texts: dict[str, list[str]]
    listed: reg.Plugin
    metrics: dict[str, float]
    e2e: E2E
    launcher: PluginLauncher


def step(*tools: str) -> scripted_pb2.ScriptedStep:
    """A scripted step calling `tools` (word_count and echo take a text)."""
    calls = [
        scripted_pb2.ScriptedToolCall(name=tool, arguments='{"text": "a b c"}') for tool in tools
    ]
    return scripted_pb2.ScriptedStep(text="ok", tool_calls=calls)


async def create(client: Client, agent_id: str, labels: dict[str, str]) -> None:
    """An agent with word_count and echo, calling both in its first step."""
    script = [step("word_count", "echo"), step(), step(), step()]
    options = agent_pb2.AgentOptions(
        provider="scripted", model="m", tools=["word_count", "echo"], labels=labels,
        provider_options=script_options(script),
    )  # fmt: skip
    await client.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id=agent_id, options=options), timeout=T
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["python", "node"])
async def run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Run]:
    """The scenario, once per language."""
    lang: str = request.param
    directory = tmp_path_factory.mktemp(f"conditions-{lang}")
    record = directory / "record.txt"
    record.touch()
    name = f"conditioned-{lang}"
    port = free_port()
    config = Config(
        listen="127.0.0.1:0", store="memory", agents=(), metrics_listen=f"127.0.0.1:{port}"
    )
    with pytest.MonkeyPatch.context() as env:
        env.delenv("AGENTLOOP_TOKEN", raising=False)
        env.delenv("AGENTLOOP_PLUGIN_TOKEN", raising=False)
        async with running_app(config) as e2e, plugin_launcher(directory) as launcher:
            plugin = await launcher.start(
                conditioned(lang, "--name", name, "--record", str(record))
            )
            await register(e2e.channel, plugin.address)
            client = Client(e2e.channel, timeout=T)
            agents = {
                "red": {"plugin": name, "team": "red"},
                "blue": {"plugin": name, "team": "blue"},
                "other": {"plugin": "someone-else"},
            }
            texts: dict[str, list[str]] = {}
            for agent_id, labels in agents.items():
                await create(client, agent_id, labels)
                for prompt in PROMPTS:
                    sent = await client.agents.SendMessage(
                        api.SendMessageRequest(agent_id=agent_id, text=prompt), timeout=T
                    )
                    events = await read_turn(client.agents, agent_id, sent.next_seq)
                    (user,) = of_kind(events, "user_message")
                    texts.setdefault(agent_id, []).append(text_of(user.user_message.content))
            await asyncio.sleep(0.3)  # the last notifications reach the plugin
            yield Run(
                lang, name, read_records(record), texts, await plugin_state(e2e.channel, name),
                await asyncio.to_thread(scrape, port), e2e, launcher,
            )  # fmt: skip


def read_records(path: Path) -> list[tuple[str, str, str]]:
    """(payload, agent, detail) of each call the plugin handled."""
    return [
        (payload, agent, detail)
        for payload, agent, detail in (line.split(" ", 2) for line in path.read_text().splitlines())
    ]


async def test_a_prompt_is_sent_only_when_its_prefix_and_regex_match(run: Run) -> None:
    prompts = [(agent, detail) for payload, agent, detail in run.records
               if payload == "prompt_submit"]  # fmt: skip
    assert prompts == [("red", "/deploy_prod"), ("blue", "/deploy_prod")]
    # The plugin's answer was applied; the prompts it was not sent are untouched.
    assert run.user_texts["red"] == [f"/deploy prod-{run.name}", "/deploy dev", "hello prod"]
    assert run.user_texts["other"] == list(PROMPTS)


async def test_a_tool_seam_is_called_only_for_the_tools_its_patterns_name(run: Run) -> None:
    tools = [(agent, detail) for payload, agent, detail in run.records
             if payload == "tool_pre_execute"]  # fmt: skip
    assert tools == [("red", "word_count"), ("blue", "word_count")]


async def test_observers_get_only_the_event_kinds_asked_for(run: Run) -> None:
    observed = [(agent, detail) for payload, agent, detail in run.records
                if payload == "agent_event"]  # fmt: skip
    assert observed, "no status event was observed"
    assert {detail for _, detail in observed} == {"status"}
    assert {agent for agent, _ in observed} == {"red", "blue"}


async def test_agent_labels_select_the_agents(run: Run) -> None:
    stops = {agent for payload, agent, _ in run.records if payload == "turn_stop"}
    assert stops == {"red"}
    assert not [record for record in run.records if record[1] == "other"]


async def test_skipped_calls_are_counted_per_seam_and_listed(run: Run) -> None:
    def skipped(seam: str) -> float:
        key = f'agentloop_plugin_calls_skipped_total{{plugin="{run.name}",seam="{seam}"}}'
        return run.metrics.get(key, 0.0)

    # Prompts: red and blue's 2 others, and all 3 of "other".
    assert skipped("agent/prompt-submit") == 7
    # Tools: echo for red and blue, both tools for "other".
    assert skipped("tools/pre-execute") == 4
    assert skipped("agent/turn-stop") > 0 and skipped("agent/event") > 0
    per_seam = {
        key: value for key, value in run.metrics.items()
        if key.startswith("agentloop_plugin_calls_skipped_total{")
    }  # fmt: skip
    # ListPlugins shows the same total (read after the scrape: it may only have grown).
    assert 0 < sum(per_seam.values()) <= run.listed.stats.skipped_calls
    # Skipped calls cost no round trip: the calls sent are exactly those recorded,
    # the observer's notifications aside (they are not answered, and not counted).
    answered = [r for r in run.records if r[0] != "agent_event"]
    assert run.listed.stats.calls == len(answered)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ("regex", "subscriptions[0] (SEAM_PROMPT_SUBMIT): conditions.prompt_regex"),
        ("seam", "(SEAM_TURN_CONTINUATION): conditions.tools: applies only to the tool seams"),
        ("kind", "(SEAM_AGENT_EVENTS): conditions.event_kinds: unknown kinds ['no_such_kind']"),
    ],
)
async def test_an_invalid_condition_is_refused_at_registration(
    run: Run, bad: str, field: str
) -> None:
    if run.lang == "node" and bad != "kind":
        pytest.skip("the Node helper refuses these itself, before serving (clients/node tests)")
    name = f"bad-{bad}-{run.lang}"
    plugin = await run.launcher.start(conditioned(run.lang, "--name", name, "--bad", bad))
    before = await list_plugins(run.e2e.channel)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await Client(run.e2e.channel, timeout=T).register_plugin(plugin.address)

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert field in (refused.value.details() or "")
    assert await list_plugins(run.e2e.channel) == before
    await plugin.kill()


async def test_bad_agent_labels_are_invalid_argument_naming_the_field(run: Run) -> None:
    client = Client(run.e2e.channel, timeout=T)
    options = agent_pb2.AgentOptions(labels={"no spaces": "x"})

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id=f"mislabelled-{run.lang}", options=options), timeout=T
        )

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _, bad = details(refused.value)
    assert [v.field for v in bad.field_violations] == ["options.labels"]
    assert "'no spaces'" in (refused.value.details() or "")
    # The server and the other agents are unharmed: the labelled agent still runs a turn.
    sent = await client.agents.SendMessage(
        api.SendMessageRequest(agent_id="red", text="/deploy staging"), timeout=T
    )
    events = await read_turn(client.agents, "red", sent.next_seq)
    (user,) = of_kind(events, "user_message")
    assert text_of(user.user_message.content) == f"/deploy staging-{run.name}"
