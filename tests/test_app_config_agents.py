"""Agents listed in the config: created at start, on fresh sessions, with their cwd."""

from __future__ import annotations

import re

from server.edge.app import App
from server.settings.config import AgentConfig, Config, parse_config


async def test_config_agents_start_on_fresh_sessions_with_their_cwd() -> None:
    config = Config(
        listen="127.0.0.1:0",
        store="memory",
        agents=(
            AgentConfig(
                id="one",
                cwd="/srv/one",
                tools=("word_count",),
                max_parallel_tool_calls=2,
                labels=(("team", "red"),),
            ),
            AgentConfig(id="two"),
        ),
    )
    app = App(config)
    await app.start()
    try:
        one, two = app.factory.agents["one"], app.factory.agents["two"]
        assert re.fullmatch(r"one-session-[0-9a-f-]{36}", one.session.session_id)
        assert one.session.header.cwd == "/srv/one"
        assert one.enabled_tools == {"word_count"}
        assert one.max_parallel_tool_calls == 2
        assert two.max_parallel_tool_calls == 10  # the server default
        assert two.session.header.cwd == ""
    finally:
        await app.stop(grace=1)


async def test_a_config_agents_labels_reach_its_options() -> None:
    config = parse_config(
        {"listen": "127.0.0.1:0", "store": "memory",
         "agents": [{"id": "red", "labels": {"team": "red"}}, {"id": "plain"}]}
    )  # fmt: skip
    app = App(config)
    await app.start()
    try:
        red, plain = app.factory.agents["red"], app.factory.agents["plain"]
        assert dict(red.options.labels) == red.labels == {"team": "red"}  # plugins select by
        assert plain.labels == {}
    finally:
        await app.stop(grace=1)
