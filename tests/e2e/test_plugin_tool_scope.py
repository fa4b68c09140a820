"""A plugin tool is offered only to agents that enable it and that its filter allows."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import E2E, of_kind, text_of
from tests.e2e.registry import register
from tests.e2e.test_plugins import create_agent, end_reason, run_turn, step
from tests.processes import PluginLauncher, configurable

pytestmark = pytest.mark.usefixtures("without_tokens")


@pytest.mark.parametrize("lang", ["python"])
async def test_plugin_tools_are_scoped_by_enablement_and_agent_filter(
    e2e: E2E, launcher: PluginLauncher, lang: str
) -> None:
    plugin = await launcher.start(
        configurable(lang, "--name", "scoped", "--tool", "nap", "--tool-sleep", "0",
                     "--tool-agents", "enabled,unused")
    )  # fmt: skip
    registered = await register(e2e.channel, plugin.address)
    assert [list(t.agent_ids) for t in registered.tools] == [["enabled", "unused"]]
    call = step(("n1", "nap", {}))
    await create_agent(e2e, "enabled", tools=["nap"], script=[call])
    await create_agent(e2e, "none", tools=[], script=[call])
    await create_agent(e2e, "filtered", tools=["nap"], script=[call])

    for agent, offered in (("enabled", True), ("none", False), ("filtered", False)):
        events = await run_turn(e2e, agent, "go")

        assert end_reason(events).WhichOneof("kind") == "completed"
        (header,) = of_kind(events, "request_header")[:1]
        names = [t.name for t in header.request_header.header.tools]
        assert ("nap" in names) == offered, (agent, names)
        (result,) = of_kind(events, "tool_result")
        if offered:
            assert text_of(result.tool_result.content) == "nap done"
        else:
            assert result.tool_result.is_error
            assert text_of(result.tool_result.content) == 'Error: unknown tool "nap"'
