"""One schema for the config, one set of agent rules shared with `CreateAgent`."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from pydantic import TypeAdapter, ValidationError

from agentloop.v1 import agent_pb2
from server.edge.app import App
from server.kernel.errors import InvalidArgument
from server.kernel.ids import id_problem
from server.kernel.limits import Limits
from server.lifecycle.factory import AgentFactory
from server.lifecycle.runtime import build_runtime
from server.loop.runtime import Runtime
from server.settings.config import (
    AgentConfig,
    Config,
    ConfigError,
    PluginConfig,
    override,
    parse_config,
)
from server.settings.fields import OptionalHostPort, keys_of


def test_every_field_is_read_from_its_camel_case_key() -> None:
    keys = keys_of(Config)
    assert keys["maxParallelToolCalls"] == "max_parallel_tool_calls"
    assert keys["pluginTimeoutSeconds"] == "plugin_timeout_seconds"
    assert set(keys.values()) == {f.name for f in dataclasses.fields(Config)}
    config = parse_config({"pluginTimeoutSeconds": 2, "shutdownGraceSeconds": 0})
    assert (config.plugin_timeout_seconds, config.shutdown_grace_seconds) == (2.0, 0.0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_parallel_tool_calls": 3}, "max_parallel_tool_calls: unknown field (known: "),
        ({"insecure": True}, "insecure: unknown field"),
        ({"providers": [{"name": "p", "baseUrl": "http://x", "kind": "openai"}]},
         "providers[0].kind: unknown field (known: apiKeyEnv, baseUrl,"),
        ({"providers": [{"name": "p", "baseUrl": "http://x", "headers": {"X-A": 1}}]},
         "providers[0].headers.X-A: must be a string"),
        ({"plugins": [{"address": "h:1", "colour": "red"}]},
         "plugins[0].colour: unknown field (known: address, failurePolicy, name, order,"),
        ({"limits": {"maxAgents": True}}, "limits.maxAgents: must be an integer"),
        ({"pluginAllowlist": ["localhost:*", 7]}, "pluginAllowlist[1]: must be a string"),
    ],
)  # fmt: skip
def test_unknown_and_mistyped_keys_are_errors_with_their_path(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value).startswith(message)


def test_the_insecure_flag_is_listed_nowhere_a_file_could_set_it() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"agentz": []})
    assert "insecure" not in str(info.value)
    assert "maxParallelToolCalls" in str(info.value)


def test_overrides_are_validated_like_the_file() -> None:
    config = override(Config(), listen="0.0.0.0:7000", insecure=True)
    assert (config.listen, config.insecure) == ("0.0.0.0:7000", True)
    with pytest.raises(ConfigError, match="^listen: 'nowhere' must be host:port$"):
        override(Config(), listen="nowhere")


def test_limits_built_in_code_are_checked_too() -> None:
    with pytest.raises(ValueError, match="must be a positive integer, not 0"):
        Limits(max_agents=0)


@pytest.mark.parametrize("agent_id", ["", "a b", "x" * 129, "a/b"])
async def test_config_and_create_agent_refuse_an_id_with_the_same_words(agent_id: str) -> None:
    with pytest.raises(ConfigError) as config_error:
        parse_config({"agents": [{"id": agent_id}]})
    with pytest.raises(InvalidArgument) as create_error:
        await AgentFactory(Runtime()).create(agent_id, agent_pb2.AgentOptions())
    problem = id_problem(agent_id)
    assert str(config_error.value) == f"agents[0].id: {problem}"
    assert str(create_error.value) == f"agent_id: {problem}"


async def test_config_and_create_agent_refuse_a_cap_and_a_cwd_with_the_same_words() -> None:
    factory = AgentFactory(Runtime())
    with pytest.raises(ConfigError) as config_error:
        parse_config({"agents": [{"id": "a", "maxParallelToolCalls": 0}]})
    with pytest.raises(InvalidArgument) as create_error:
        await factory.create("a", agent_pb2.AgentOptions(max_parallel_tool_calls=0))
    assert str(config_error.value).split(": ", 1)[1] == create_error.value.problem
    with pytest.raises(ConfigError) as config_error:
        parse_config({"agents": [{"id": "a", "cwd": "srv"}]})
    with pytest.raises(InvalidArgument) as create_error:
        await factory.create("a", agent_pb2.AgentOptions(), cwd="srv")
    assert str(config_error.value).split(": ", 1)[1] == create_error.value.problem


async def test_create_agent_names_the_first_unknown_tool_and_the_known_ones() -> None:
    runtime = build_runtime(Config(store="memory"))
    options = agent_pb2.AgentOptions(tools=["word_count", "rm_rf", "nope"])
    with pytest.raises(InvalidArgument) as info:
        await AgentFactory(runtime).create("a", options)
    assert str(info.value) == (
        "options.tools: 'rm_rf' is not a registered tool"
        " (known: current_time, echo, sleep, word_count)"
    )


def test_with_plugins_a_tool_may_be_one_a_plugin_registers() -> None:
    raw = {"agents": [{"id": "a", "tools": ["word_count", "plugin_tool"]}]}
    with pytest.raises(ConfigError, match=r"^agents\[0\]\.tools: 'plugin_tool' is not a built-in"):
        parse_config(raw)
    config = parse_config({**raw, "plugins": [{"address": "127.0.0.1:50100"}]})
    assert config.agents[0].tools == ("word_count", "plugin_tool")


async def test_a_config_agent_naming_an_unregistered_tool_meets_the_create_agent_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # With a plugin configured, the tool might be the plugin's: the file's checks let it
    # through, and the agent's creation at start applies CreateAgent's check to it. This
    # plugin never answers (nothing listens on port 1), so the tool never comes.
    plugin = PluginConfig(address="127.0.0.1:1", required=False)
    config = Config(
        listen="127.0.0.1:0",
        store="memory",
        plugins=(plugin,),
        agents=(AgentConfig(id="bad", tools=("nope",)), AgentConfig(id="good")),
    )
    app = App(config)
    with caplog.at_level(logging.ERROR, logger="server.edge.app"):
        await app.start()
    try:
        assert sorted(app.factory.agents) == ["good"]
        assert "config agent bad was not started: options.tools: 'nope'" in caplog.text
    finally:
        await app.stop(grace=1)


def test_a_config_built_in_code_is_checked_like_a_file() -> None:
    with pytest.raises(ValueError, match="'nope' is not a built-in tool"):
        Config(agents=(AgentConfig(id="a", tools=("nope",)),))


def test_an_optional_address_is_empty_or_host_port() -> None:
    adapter = TypeAdapter(OptionalHostPort)
    assert adapter.validate_python("") == ""
    assert adapter.validate_python("127.0.0.1:8080") == "127.0.0.1:8080"
    with pytest.raises(ValidationError, match="'8080' must be host:port"):
        adapter.validate_python("8080")
