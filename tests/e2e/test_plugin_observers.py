"""Observer notifications: a subscription's own buffer, and every drop accounted for."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_pb2
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.conftest import E2E, read_turn
from tests.e2e.registry import eventually, plugin_state, register
from tests.e2e.test_plugins import T, create_agent
from tests.processes import PluginLauncher, configurable

pytestmark = pytest.mark.usefixtures("without_tokens")


def seen(path: Path) -> list[tuple[str, int]]:
    """The (kind, dropped) of each notification the plugin received."""
    if not path.exists():
        return []
    return [(kind, int(n)) for kind, n in (line.split() for line in path.read_text().splitlines())]


async def test_a_small_observer_buffer_drops_and_counts_every_dropped_event(
    e2e: E2E, launcher: PluginLauncher, tmp_path: Path
) -> None:
    path = tmp_path / "seen.txt"
    plugin = await launcher.start(
        configurable("python", "--name", "watcher", "--observe-file", str(path), "--buffer", "4")
    )
    registered = await register(e2e.channel, plugin.address)
    assert [s.buffer_size for s in registered.subscriptions] == [4]
    # 2,000 chunks, each an `assistant_chunk` event, appended without a pause: the
    # buffer of 4 overflows.
    step = agent_pb2.ScriptedStep(text="x" * 2000, chunk_size=1)
    await create_agent(e2e, "chatty", script=[step])
    await e2e.agents.SendMessage(api.SendMessageRequest(agent_id="chatty", text="go"), timeout=T)
    first = await read_turn(e2e.agents, "chatty", 0)  # every event of the agent so far
    # A second turn: its first notification carries the drops not reported yet.
    await e2e.agents.SendMessage(api.SendMessageRequest(agent_id="chatty", text="go"), timeout=T)

    async def second_turn_seen() -> bool:
        return [kind for kind, _ in seen(path)].count("turn_start") == 2

    await eventually(second_turn_seen, "the observer to see the second turn start")
    received = seen(path)
    # Each notification stands for itself and the `dropped` events before it: so the
    # second turn_start sits right after every event of the first turn.
    at = [kind for kind, _ in received].index("turn_start", 1)
    assert sum(1 + dropped for _, dropped in received[: at + 1]) - 1 == len(first)
    dropped = sum(n for _, n in received[: at + 1])
    assert dropped > 0
    stats = (await plugin_state(e2e.channel, "watcher")).stats
    assert stats.dropped_notifications >= dropped


async def test_notifications_buffered_when_the_plugin_dies_are_counted_dropped(
    e2e: E2E, launcher: PluginLauncher, tmp_path: Path
) -> None:
    path = tmp_path / "seen.txt"
    plugin = await launcher.start(
        configurable("python", "--name", "stalled", "--observe-file", str(path),
                     "--buffer", "100000")
    )  # fmt: skip
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "flood", script=[agent_pb2.ScriptedStep(text="ok")] * 60)
    # Stopped, it reads nothing: once the socket buffers and the stream's flow-control
    # window are full (far less than 60 turns of 500 kB prompts), notifications wait
    # in the server's buffer, which is big enough for all of them.
    plugin.process.send_signal(signal.SIGSTOP)
    for _ in range(60):
        sent = await e2e.agents.SendMessage(
            api.SendMessageRequest(agent_id="flood", text="x" * 500_000), timeout=T
        )
        await read_turn(e2e.agents, "flood", sent.next_seq)
    assert (await plugin_state(e2e.channel, "stalled")).stats.dropped_notifications == 0

    await plugin.kill()

    async def counted() -> bool:
        listed = await plugin_state(e2e.channel, "stalled")
        return listed.state != reg.PLUGIN_STATE_READY and listed.stats.dropped_notifications > 0

    await eventually(counted, "the notifications buffered at the disconnect to be counted")
