"""A plugin model's calls carry the messages of the straightforward encoding, over turns.

The server keeps each agent's history encoded between model calls (the call's
messages are framed from kept bytes); the plugin process `tests/plugins/recording_model.py`
records every call it receives, and each must be the call built afresh from the stored
log, including after its own `agent/step-result` rewrite and behind its session prefix.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, content_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.core.content import plain_text
from server.settings.config import Config
from tests.e2e.conftest import READ_TIMEOUT, read_turn, running_app
from tests.e2e.registry import register
from tests.processes import PluginLauncher
from tests.replayed_requests import replayed_requests

PLUGIN = Path(__file__).parents[1] / "plugins" / "recording_model.py"


async def test_each_model_call_carries_the_request_built_afresh_from_the_log(
    launcher: PluginLauncher, tmp_path: Path
) -> None:
    record = tmp_path / "calls.hex"
    plugin = await launcher.start([sys.executable, str(PLUGIN), "--record-file", str(record)])
    async with running_app(Config(listen="127.0.0.1:0", store="memory")) as e2e:
        await register(e2e.channel, plugin.address)
        options = agent_pb2.AgentOptions(provider="recorder", tools=["word_count"])
        await e2e.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="a", options=options), timeout=READ_TIMEOUT
        )
        for text in ("one two three", 'ünï "cödé" ✓\n\ttwo', "last one"):
            sent = await e2e.agents.SendMessage(
                api.SendMessageRequest(agent_id="a", text=text), timeout=READ_TIMEOUT
            )
            events = await read_turn(e2e.agents, "a", sent.next_seq)
            assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
        stored = await e2e.app.factory.get("a").session.read(1, 10_000)
    requests = replayed_requests(stored)
    lines = record.read_text().split()
    calls = [hk.ModelStreamCall.FromString(bytes.fromhex(line)) for line in lines]
    assert len(calls) == len(requests) == 6  # two steps a turn: the tool call, then a text
    for request, received in zip(requests, calls, strict=True):
        expected = hk.ModelStreamCall(
            provider="recorder", header=request.header, messages=request.messages
        )
        assert received.SerializeToString(deterministic=True) == expected.SerializeToString(
            deterministic=True
        ), (request.turn, request.step)
    # The rewrite reached the next calls; the prefix fronted every call.
    said = [plain_text(m.content) for m in calls[-1].messages]
    assert said[0] == "PREFIX"
    assert "REWRITTEN: counted 3 words" in said
    assert all(call.messages[0].role == content_pb2.ROLE_USER for call in calls)
