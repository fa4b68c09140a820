"""A failing plugin at a tool seam ends the turn `error`, once, naming the plugin and seam.

Real plugin processes (`tests/plugins/configurable.py`) misbehave at `tools/pre-execute`,
`tools/post-execute` or in a plugin tool: they hang past the deadline, answer an error
that names an address, answer another seam's decision, or die mid-call. The model
never sees the detail: the call's result is a neutral error, and no later step runs.
"""

from __future__ import annotations

import pytest

from server.loop.tool_pipeline import FATAL_TEXT
from tests.e2e.conftest import E2E, kinds, of_kind, text_of
from tests.e2e.registry import register
from tests.e2e.test_plugins import create_agent, end_reason, run_turn, step
from tests.processes import PluginLauncher, configurable, rogue

SEAMS = {
    "pre-execute": "tools/pre-execute",
    "post-execute": "tools/post-execute",
    "tool": "tools/execute",
}
CODES = {
    "hang": "PLUGIN_TIMEOUT",
    "error": "PLUGIN_ERROR",
    "malformed": "PLUGIN_MALFORMED",
    "die": "PLUGIN_DISCONNECTED",
}


@pytest.mark.parametrize("seam", list(SEAMS))
@pytest.mark.parametrize("fault", list(CODES))
async def test_a_failing_tool_seam_plugin_ends_the_turn_error(
    e2e: E2E, launcher: PluginLauncher, seam: str, fault: str
) -> None:
    name = f"faulty-{seam}-{fault}"
    plugin = await launcher.start(
        configurable("python", "--name", name, "--fault", fault, "--fault-seam", seam,
                     "--tool", "faulty")
    )  # fmt: skip
    await register(e2e.channel, plugin.address, deadline=0.5 if fault == "hang" else None)
    tool = "faulty" if seam == "tool" else "echo"
    # Two calls: the first fails the turn, the second never starts.
    await create_agent(
        e2e, "victim", tools=["echo", "faulty"],
        script=[step(("a1", tool, {"text": "x"}), ("a2", "echo", {"text": "y"}))],
    )  # fmt: skip

    events = await run_turn(e2e, "victim", "go")

    reason = end_reason(events)
    assert reason.WhichOneof("kind") == "error", reason
    assert reason.error.code == CODES[fault], reason.error
    assert f'plugin "{name}" failed at {SEAMS[seam]}' in reason.error.message
    assert kinds(events).count("turn_end") == 1
    # One step only: the model was not asked again with the failure.
    assert kinds(events).count("step_start") == 1
    (result,) = of_kind(events, "tool_result")
    assert result.tool_result.call_id == "a1" and result.tool_result.is_error
    assert text_of(result.tool_result.content) == FATAL_TEXT
    assert "10.9.8.7" not in str(events[:-1]) and "ipv4" not in str(events[:-1])
    assert [e.tool_call.call_id for e in of_kind(events, "tool_call")] == ["a1"]


async def test_a_handle_stream_ended_with_an_error_status_fails_the_tool_call_closed(
    e2e: E2E, launcher: PluginLauncher
) -> None:
    plugin = await launcher.start(rogue("--name", "aborter", "--pre-execute", "--abort"))
    await register(e2e.channel, plugin.address)
    await create_agent(e2e, "victim", tools=["echo"], script=[step(("a1", "echo", {"text": "x"}))])

    events = await run_turn(e2e, "victim", "go")

    reason = end_reason(events)
    assert reason.WhichOneof("kind") == "error", reason
    assert reason.error.code == "PLUGIN_DISCONNECTED", reason.error
    assert 'plugin "aborter" failed at tools/pre-execute' in reason.error.message
    assert "INTERNAL" in reason.error.message  # the operator sees the status ...
    (result,) = of_kind(events, "tool_result")
    assert text_of(result.tool_result.content) == FATAL_TEXT  # ... the model does not
    assert "10.9.8.7" not in str(events[:-1])
