"""Observer notifications: a subscription's own buffer, and every drop accounted for."""

from __future__ import annotations

from pathlib import Path

import pytest

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
