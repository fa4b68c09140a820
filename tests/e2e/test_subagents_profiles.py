"""Sub-agent profiles of the server config: checked at start, applied by `delegate`.

A real server from a parsed YAML config; the parent is scripted. A profile's `tools`
keep only the parent's; its `grantTools` are given regardless; the rest is the
parent's unless the profile sets it. An agent's own profile of the same name wins.
"""

from __future__ import annotations

import pytest
import yaml

from agentloop.v1 import agent_service_pb2 as api
from server.settings.config import ConfigError, parse_config
from tests.e2e.conftest import running_app
from tests.e2e.subagents import T, calling, create, get, says, scripted, send, wait_idle

CONFIG = """
listen: 127.0.0.1:0
store: memory
agents: []
subagentProfiles:
  - name: reviewer
    provider: scripted
    model: reviewer-model
    persona: "You review the work."
    tools: [word_count, current_time]
    grantTools: [echo]
    approvalRequiredTools: [echo]
    approvalTimeoutSeconds: 30
  - name: plain
"""


def background(call_id: str, profile: str) -> dict[str, object]:
    return {"task": "look", "mode": "background", "profile": profile}


async def test_a_config_profile_shapes_the_child_within_its_parents_tools() -> None:
    async with running_app(parse_config(yaml.safe_load(CONFIG))) as e2e:
        parent = scripted(
            calling(
                ("r", "delegate", background("r", "reviewer")),
                ("p", "delegate", background("p", "plain")),
                ("x", "delegate", background("x", "nobody")),
            ),
            says("started"),
            tools=("delegate", "collect", "word_count", "sleep"),
        )
        parent.persona = "You lead."
        await create(e2e, "lead", parent)
        await send(e2e, "lead", "go")
        await wait_idle(e2e, "lead")
        reviewer = (await get(e2e, "lead.r")).options
        # current_time is the profile's but not the parent's: left out; echo is granted.
        assert list(reviewer.tools) == ["word_count", "echo"]
        assert (reviewer.provider, reviewer.model, reviewer.persona) == (
            "scripted", "reviewer-model", "You review the work.",
        )  # fmt: skip
        assert list(reviewer.approval_required_tools) == ["echo"]
        assert reviewer.approval_timeout.seconds == 30
        plain = (await get(e2e, "lead.p")).options
        # Unset, everything is the parent's, less its delegation tools.
        assert list(plain.tools) == ["word_count", "sleep"]
        assert (plain.provider, plain.model, plain.persona) == ("scripted", "m", "You lead.")
        page = await e2e.agents.ListSessionEvents(
            api.ListSessionEventsRequest(agent_id="lead", page_size=100), timeout=T
        )
        results = {
            e.tool_result.call_id: e.tool_result for e in page.events if e.tool_result.call_id
        }
        assert results["x"].is_error
        text = results["x"].content[0].text.text
        assert 'unknown profile "nobody"' in text and "known: plain, reviewer" in text


async def test_an_agents_own_profile_wins_over_the_configs() -> None:
    async with running_app(parse_config(yaml.safe_load(CONFIG))) as e2e:
        parent = scripted(
            calling(("r", "delegate", background("r", "reviewer"))),
            says("started"),
            tools=("delegate", "word_count"),
        )
        parent.subagent_profiles["reviewer"].CopyFrom(scripted(says("mine"), tools=()))
        await create(e2e, "own", parent)
        await send(e2e, "own", "go")
        await wait_idle(e2e, "own")
        child = (await get(e2e, "own.r")).options
        assert list(child.tools) == [] and child.model == "m"


@pytest.mark.parametrize(
    ("profiles", "field", "message"),
    [
        ([{"name": "a"}, {"name": "a"}], "subagentProfiles[1].name", "duplicate profile name"),
        ([{"name": "bad id!"}], "subagentProfiles[0].name", ""),
        ([{"name": "a", "provider": "nope"}], "subagentProfiles[0].provider", "nope"),
        ([{"name": "a", "tools": ["word_count", "nope"]}], "subagentProfiles[0].tools", "nope"),
        ([{"name": "a", "grantTools": ["nope"]}], "subagentProfiles[0].grantTools", "nope"),
        ([{"name": "a", "approvalTimeoutSeconds": -1}],
         "subagentProfiles[0].approvalTimeoutSeconds", ""),
        ([{"name": "a", "approvalTimeoutSeconds": 0}],
         "subagentProfiles[0].approvalTimeoutSeconds", "above 0"),
        ([{"name": "a", "colour": "red"}], "subagentProfiles[0].colour", "unknown field"),
    ],
)  # fmt: skip
def test_a_bad_profile_stops_the_server_naming_the_field(
    profiles: list[dict[str, object]], field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"agents": [], "subagentProfiles": profiles})
    assert field in str(info.value)
    assert message in str(info.value)
