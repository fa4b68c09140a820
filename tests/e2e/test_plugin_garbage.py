"""A turn with a real plugin process on every seam leaves no reference cycles.

Every seam call goes through the plugin's `Handle` stream (gRPC), its waterfall chain,
its decision and the notifications of the turn's events. A cycle per call (a closure
that calls itself, an object and its helper holding each other) would be garbage only
the cyclic collector frees, and with a plugin on every seam it came about sixty objects
a turn. Counted, not timed: the collector's own count of unreachable objects after
turns ran with it switched off.
"""

from __future__ import annotations

import sys

from server.plugins.registry import Overrides
from tests.e2e.conftest import E2E
from tests.processes import PluginLauncher
from tests.test_garbage import OPTIONS, unreachable_after_turns

EVERY_SEAM = [sys.executable, "bench/every_seam_plugin.py"]
"""The benchmarks' plugin: the Python helper on every seam, answering "continue"."""


async def test_turns_with_a_plugin_on_every_seam_leave_no_reference_cycles(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(EVERY_SEAM)
    await e2e.app.plugins.register(plugin.address, Overrides())
    agent = await e2e.app.factory.create("garbage", OPTIONS)
    stats = e2e.app.plugins.plugins[plugin.name].stats
    unreachable = await unreachable_after_turns(agent)
    assert stats.calls >= 25 * 10  # it decided, about 13 times a turn
    assert agent.session.events[-1].WhichOneof("payload") == "turn_end"
    assert unreachable == 0
