"""`agentloop children` and `agentloop send`'s tree of work, as real subprocesses.

A real in-process server on a real port; the agents are scripted: a parent delegates
to a child that itself delegates (in the background) to a grandchild.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from agentloop.client import Client, connect
from agentloop.v1 import agent_pb2, scripted_pb2
from server.edge.app import App
from server.settings.config import Config
from tests.e2e.subagents import calling, says, scripted
from tests.test_cli import run_cli

TOOLS = ("delegate", "collect")


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = App(Config(listen="127.0.0.1:0", store="memory", agents=()))
    port = await app.start()
    yield f"127.0.0.1:{port}"
    await app.stop(grace=0)


@pytest.fixture
async def client(server: str) -> AsyncIterator[Client]:
    client = connect(server)
    yield client
    await client.close()


def slowly(text: str, step: scripted_pb2.ScriptedStep) -> scripted_pb2.ScriptedStep:
    """`step` with `text` streamed before its calls, 30 ms a character.

    The CLI's stream follows live events from when it opens: a turn slower than that
    start shows all of its children's progress.
    """
    step.MergeFrom(says(text, delay_ms=30))
    return step


def team(mode: str) -> agent_pb2.AgentOptions:
    """A parent whose child does two steps and starts a background grandchild."""
    leaf = scripted(says("leaf answer"))
    child = scripted(
        slowly(
            "looking",
            calling(("g1", "delegate", {"task": "dig", "mode": "background", "profile": "leaf"})),
        ),
        says("child answer", delay_ms=60),  # the grandchild ends first
        tools=TOOLS,
    )
    child.subagent_profiles["leaf"].CopyFrom(leaf)
    parent = scripted(
        slowly(
            "splitting",
            calling(("d1", "delegate", {"task": "look", "mode": mode, "profile": "child"})),
        ),
        says("all done"),
        tools=TOOLS,
    )
    parent.subagent_profiles["child"].CopyFrom(child)
    return parent


async def test_send_shows_each_child_step_under_the_call_that_made_it(
    server: str, client: Client
) -> None:
    await client.create("boss", team("foreground"))
    result = await run_cli(server, "send", "boss", "split the work")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    call = lines.index(next(line for line in lines if line.startswith("→ tool delegate(")))
    branch = lines.index("  ├─ sub-agent boss.d1 (delegate d1)")
    # The grandchild's reports bubbled up: a branch under its parent's, one deeper.
    sub_branch = lines.index("  │   ├─ sub-agent boss.d1.g1 (call g1)")
    assert call < branch < sub_branch
    below = lines[branch + 1 :]
    steps = [line for line in below if line.startswith("  │   ") and line[6] not in "├│"]
    assert steps == ["  │   step 1 running: looking", "  │   step 2 running: child answer",
                     "  │   completed: child answer"]  # fmt: skip
    deeper = [line for line in below if line.startswith("  │   │   ")]
    assert deeper == ["  │   │   step 1 running: leaf answer", "  │   │   completed: leaf answer"]
    assert lines[-1] == "[turn 1 completed]"
    # With --json, the progress is the live event itself, one object a line.
    await client.create("boss-json", team("foreground"))
    result = await run_cli(server, "--json", "send", "boss-json", "again")
    assert result.code == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    progress = [o["child_progress"] for o in objects if "child_progress" in o]
    mine = [(p["child_agent_id"], p["parent_agent_id"], p["state"]) for p in progress]
    assert [m for m in mine if m[0] == "boss-json.d1"] == [
        ("boss-json.d1", "boss-json", "running"),
        ("boss-json.d1", "boss-json", "running"),
        ("boss-json.d1", "boss-json", "completed"),
    ]
    assert [m for m in mine if m[0] != "boss-json.d1"] == [
        ("boss-json.d1.g1", "boss-json.d1", "running"),
        ("boss-json.d1.g1", "boss-json.d1", "completed"),
    ]


async def test_children_lists_an_agents_children_and_the_whole_tree(
    server: str, client: Client
) -> None:
    await client.create("lead", team("background"))
    turn = await client.send("lead", "start")
    await turn.result()
    await client.wait_idle("lead.d1")  # the child ended its turn; it waits to be collected
    listed = await run_cli(server, "children", "lead")
    assert listed.code == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith("lead  idle  ")
    assert len(lines) == 2 and lines[1].startswith("└─ lead.d1  idle  ")
    assert lines[1].endswith("(call d1)")
    tree = await run_cli(server, "children", "lead", "--tree")
    assert tree.code == 0, tree.stderr
    lines = tree.stdout.splitlines()
    assert lines[1].startswith("└─ lead.d1  ")
    assert lines[2].startswith("   └─ lead.d1.g1  ") and lines[2].endswith("(call g1)")
    as_json = await run_cli(server, "--json", "children", "lead", "--tree")
    data = json.loads(as_json.stdout)
    assert data["agent"]["agent_id"] == "lead"
    assert [(c["agent_id"], c["depth"]) for c in data["children"]] == [
        ("lead.d1", 1),
        ("lead.d1.g1", 2),
    ]
    assert data["children"][1]["lineage"]["parent_agent_id"] == "lead.d1"
    none = await run_cli(server, "children", "lead.d1.g1")
    assert none.stdout == "no sub-agents\n"
    missing = await run_cli(server, "children", "nobody")
    assert missing.code == 2 and "NOT_FOUND" in missing.stderr
