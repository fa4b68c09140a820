"""A configured OpenAI-compatible provider serving a turn end to end through the gRPC API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.kernel.content import plain_text
from server.settings.config import load_config
from tests.e2e.conftest import kinds, read_turn, running_app
from tests.fake_openai import FakeOpenAI, Reply, call, chunk, text, usage

KEY = "sk-e2e-secret-key"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


async def test_a_configured_provider_serves_a_tool_round_trip(
    fake: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_OPENAI_KEY", KEY)
    config_file = tmp_path / "agentloop.yaml"
    config_file.write_text(
        "listen: 127.0.0.1:0\n"
        "store: memory\n"
        "providers:\n"
        "  - name: fake\n"
        f"    baseUrl: {fake.base_url}\n"
        "    apiKeyEnv: FAKE_OPENAI_KEY\n"
        "    defaultModel: gpt-test\n"
        "    headers: {X-Team: agents}\n"
    )
    fake.script(
        Reply(events=[call(0, "", call_id="call_1", name="word_count"), call(0, '{"text": '),
                      call(0, '"one two three"}'), chunk(finish="tool_calls"),
                      usage(12, 5)]),
        Reply(events=[*text("There are ", "3 words."), usage(30, 4)]),
    )  # fmt: skip
    async with running_app(load_config(config_file)) as e2e:
        options = agent_pb2.AgentOptions(provider="fake", tools=["word_count"])
        await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="real", options=options))
        sent = await e2e.agents.SendMessage(api.SendMessageRequest(agent_id="real", text="count"))
        events = await read_turn(e2e.agents, "real", sent.next_seq)
    assert kinds(events).count("step_start") == 2
    result = next(e.tool_result for e in events if e.HasField("tool_result"))
    assert plain_text(result.content) == "3 words"
    messages = [e.assistant_message for e in events if e.HasField("assistant_message")]
    assert plain_text(messages[-1].content) == "There are 3 words."
    assert messages[0].usage.input_tokens == 12
    assert messages[-1].provenance.model == "gpt-test"
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    first, second = fake.requests
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert first.headers["x-team"] == "agents"
    assert first.body["model"] == "gpt-test"
    tool_message = second.body["messages"][-1]
    assert (tool_message["role"], tool_message["tool_call_id"]) == ("tool", "call_1")
    assert KEY not in str([e.SerializeToString() for e in events])
