"""Observer notifications: a subscription's own buffer, and every drop accounted for."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import scripted_pb2, session_event_pb2
from tests.e2e.conftest import E2E, read_turn
from tests.e2e.registry import eventually, plugin_state, register
from tests.e2e.test_plugins import T, create_agent
from tests.processes import PluginLauncher, configurable

pytestmark = pytest.mark.usefixtures("without_tokens")

Event = session_event_pb2.SessionEvent


def seen(path: Path) -> list[tuple[str, int]]:
    """The (kind, dropped) of each notification the plugin received."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # a last line without its newline is unfinished
    return [(kind, int(n)) for kind, n in (line.split() for line in lines)]


async def test_a_small_observer_buffer_drops_and_counts_every_dropped_event(
    e2e: E2E, launcher: PluginLauncher, tmp_path: Path
) -> None:
    path = tmp_path / "seen.txt"
    plugin = await launcher.start(
        configurable("python", "--name", "watcher", "--observe-file", str(path), "--buffer", "4")
    )
    registered = await register(e2e.channel, plugin.address)
    assert [s.buffer_size for s in registered.subscriptions] == [4]
    await create_agent(e2e, "chatty", script=[scripted_pb2.ScriptedStep(text="ok")] * 40)
    # Stopped, the plugin reads nothing: its stream backs up, then the buffer of 4 is
    # full, and what comes next is dropped.
    plugin.process.send_signal(signal.SIGSTOP)
    for _ in range(30):
        await turn(e2e, "x" * 500_000)
    plugin.process.send_signal(signal.SIGCONT)
    total = (await turn(e2e, "go"))[-1].seq  # sessions number events from 1

    async def all_accounted_for() -> bool:
        dropped = (await plugin_state(e2e.channel, "watcher")).stats.dropped_notifications
        return len(seen(path)) + dropped == total

    # Each event is delivered or counted dropped: none vanished.
    await eventually(all_accounted_for, "every event to be delivered or counted dropped")
    stats = (await plugin_state(e2e.channel, "watcher")).stats
    # Drops were reported in band too, on later notifications (the last ones may still
    # wait for a notification to carry them).
    reported = sum(n for _, n in seen(path))
    assert 0 < reported <= stats.dropped_notifications


async def turn(e2e: E2E, text: str) -> list[Event]:
    """One turn of the agent "chatty"; its events."""
    sent = await e2e.agents.SendMessage(
        api.SendMessageRequest(agent_id="chatty", text=text), timeout=T
    )
    return await read_turn(e2e.agents, "chatty", sent.next_seq)


async def test_notifications_buffered_when_the_plugin_dies_are_counted_dropped(
    e2e: E2E, launcher: PluginLauncher, tmp_path: Path
) -> None:
    path = tmp_path / "seen.txt"
    plugin = await launcher.start(
        configurable("python", "--name", "stalled", "--observe-file", str(path),
                     "--buffer", "100000")
    )  # fmt: skip
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "flood", script=[scripted_pb2.ScriptedStep(text="ok")] * 60)
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
