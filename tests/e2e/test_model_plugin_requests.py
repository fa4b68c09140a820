"""A plugin model's calls carry the messages of the straightforward encoding, over turns.

The server keeps each agent's history encoded between model calls (the call's
messages are framed from kept bytes); the plugin process `tests/plugins/recording_model.py`
records every call it receives, and each must be the call built afresh from the stored
log, including after its own `agent/step-result` rewrite and behind its session prefix.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, content_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.kernel.content import plain_text
from server.models import ModelRequest
from server.models.appended import SLICE_BYTES
from server.plugins.model import PluginModel
from server.settings.config import Config
from tests.e2e.conftest import READ_TIMEOUT, read_turn, running_app
from tests.e2e.registry import register
from tests.processes import PluginLauncher
from tests.replayed_requests import replayed_requests

PLUGIN = Path(__file__).parents[1] / "plugins" / "recording_model.py"


def recorded_calls(record: Path) -> list[hk.ModelStreamCall]:
    """The model calls the recording plugin received, in order (a hex line each)."""
    return [
        hk.ModelStreamCall.FromString(bytes.fromhex(line)) for line in record.read_text().split()
    ]


def assert_each_is_its_request(
    calls: list[hk.ModelStreamCall], requests: list[ModelRequest]
) -> None:
    """Each call holds exactly the request replayed from the log for its step."""
    for request, received in zip(requests, calls, strict=True):
        expected = hk.ModelStreamCall(
            provider="recorder", header=request.header, messages=request.messages
        )
        assert received.SerializeToString(deterministic=True) == expected.SerializeToString(
            deterministic=True
        ), (request.turn, request.step)


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
    calls = recorded_calls(record)
    assert len(calls) == len(requests) == 6  # two steps a turn: the tool call, then a text
    assert_each_is_its_request(calls, requests)
    # The rewrite reached the next calls; the prefix fronted every call.
    said = [plain_text(m.content) for m in calls[-1].messages]
    assert said[0] == "PREFIX"
    assert "REWRITTEN: counted 3 words" in said
    assert all(call.messages[0].role == content_pb2.ROLE_USER for call in calls)


async def test_a_resumed_long_history_reaches_the_plugin_in_slices_byte_for_byte(
    launcher: PluginLauncher, tmp_path: Path
) -> None:
    """After a resume, the agent's first call carries its whole history, encoded a slice at
    a time (a probe on the server's event loop sees the kept encoding grow between two),
    and every call is still the one built afresh from the stored log."""
    record = tmp_path / "calls.hex"
    plugin = await launcher.start([sys.executable, str(PLUGIN), "--record-file", str(record)])
    config = Config(listen="127.0.0.1:0", store="sqlite", data_dir=str(tmp_path), agents=())
    turns = 5
    async with running_app(config) as e2e:
        await register(e2e.channel, plugin.address)
        options = agent_pb2.AgentOptions(provider="recorder", tools=["word_count"])
        await e2e.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="a", session_id="long", options=options),
            timeout=READ_TIMEOUT,
        )

        async def turn(text: str) -> None:
            sent = await e2e.agents.SendMessage(
                api.SendMessageRequest(agent_id="a", text=text), timeout=READ_TIMEOUT
            )
            events = await read_turn(e2e.agents, "a", sent.next_seq)
            assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"

        for i in range(turns):  # each prompt goes twice: as itself and as the tool's input
            await turn(f"{i} " + "wörd " * 6_000)
        await e2e.factory.DisposeAgent(fac.DisposeAgentRequest(agent_id="a"), timeout=READ_TIMEOUT)
        await e2e.factory.ResumeAgent(
            fac.ResumeAgentRequest(agent_id="a", session_id="long"), timeout=READ_TIMEOUT
        )
        model = e2e.app.runtime.models.get("recorder")
        assert isinstance(model, PluginModel)
        seen: list[int] = []
        running = True

        async def probe() -> None:
            while running:
                history = model._histories.get("a")
                seen.append(history.kept if history is not None else 0)
                await asyncio.sleep(0)

        watching = asyncio.create_task(probe())
        await turn("after the resume")
        running = False
        await watching
        stored = await e2e.app.factory.get("a").session.read(1, 100_000)
    requests = replayed_requests(stored)
    calls = recorded_calls(record)
    assert len(calls) == len(requests) == 2 * turns + 2
    assert_each_is_its_request(calls, requests)
    assert calls[-2].ByteSize() > 3 * SLICE_BYTES
    whole = len(requests[-2].messages) - 1  # the history behind the plugin's prefix
    assert len({k for k in seen if 0 < k < whole}) >= 3, seen
