"""The YAML config: defaults, the shipped example, and errors that name the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from server.kernel.errors import InvalidArgument
from server.kernel.limits import LIMIT_FIELDS, Limits
from server.settings.addresses import Allowlist, parse_address
from server.settings.config import DEFAULT_AGENT, ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent


def test_no_file_gives_the_embedded_defaults() -> None:
    config = load_config(None)
    assert config.listen == "127.0.0.1:50051"
    assert config.max_parallel_tool_calls == 10
    assert config.agents == (DEFAULT_AGENT,)


def test_the_shipped_example_parses() -> None:
    config = load_config(ROOT / "agentloop.example.yaml")
    (agent,) = config.agents
    assert agent.id == "assistant"
    assert agent.max_parallel_tool_calls == 4
    assert agent.tools == ("current_time", "word_count")
    assert config.limits == Limits()  # the example documents the defaults


def test_the_readme_limits_table_documents_every_default() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `((?:max|http|grpc)\w+)` \| ([\d.]+)", readme, re.M)
    documented = {LIMIT_FIELDS[name]: float(value) for name, value in rows}
    defaults = Limits()
    assert documented == {f: getattr(defaults, f) for f in LIMIT_FIELDS.values()}


def test_an_empty_file_is_all_defaults() -> None:
    config = parse_config({})
    assert config.agents == ()
    assert (config.store, config.data_dir) == ("sqlite", "data")


def test_storage_and_resume_fields() -> None:
    config = parse_config(
        {"store": "memory", "dataDir": "/var/lib/agentloop",
         "agents": [{"id": "back", "resumeSessionId": "s-1"}]}
    )  # fmt: skip
    assert (config.store, config.data_dir) == ("memory", "/var/lib/agentloop")
    assert config.agents[0].resume_session_id == "s-1"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"listen": "nowhere"}, "listen"),
        ({"maxParallelToolCalls": 0}, "maxParallelToolCalls"),
        ({"maxParallelToolCalls": True}, "maxParallelToolCalls"),
        ({"agents": [{"model": "m"}]}, "agents[0].id"),
        ({"agents": [{"id": "a", "maxParallelToolCalls": -1}]}, "agents[0].maxParallelToolCalls"),
        ({"agents": [{"id": "a", "cwd": "relative"}]}, "agents[0].cwd"),
        ({"agents": [{"id": "a"}, {"id": "a"}]}, "agents[1].id"),
        ({"agents": [{"id": "a", "tools": "word_count"}]}, "agents[0].tools"),
        ({"agents": [{"id": "a", "colour": "red"}]}, "agents[0].colour"),
        ({"agentz": []}, "agentz"),
        ({"store": "redis"}, "store"),
        ({"pluginTimeoutSeconds": 0}, "pluginTimeoutSeconds"),
        ({"toolOrder": ["echo"]}, "toolOrder"),
        ({"toolOrder": "echo"}, "toolOrder"),
        ({"toolOrder": ["echo", "echo", "<unlisted-tools>"]}, "toolOrder"),
        ({"providers": [{"baseUrl": "http://x"}]}, "providers[0].name"),
        ({"providers": [{"name": "p", "baseUrl": "ftp://x"}]}, "providers[0].baseUrl"),
        (
            {"providers": [{"name": "p", "baseUrl": "http://x", "type": "grpc"}]},
            "providers[0].type",
        ),
        ({"providers": [{"name": "scripted", "baseUrl": "http://x"}]}, "providers[0].name"),
        (
            {"providers": [{"name": "p", "baseUrl": "http://x", "maxAttempts": 0}]},
            "providers[0].maxAttempts",
        ),
        (
            {"providers": [{"name": "p", "baseUrl": "http://x", "readTimeoutSeconds": -1}]},
            "providers[0].readTimeoutSeconds",
        ),
        ({"plugins": [{"order": 1}]}, "plugins[0].address"),
        ({"plugins": [{"address": "h:1", "failurePolicy": "maybe"}]}, "plugins[0].failurePolicy"),
        ({"plugins": [{"address": "h:1", "timeoutSeconds": 0}]}, "plugins[0].timeoutSeconds"),
        ({"plugins": [{"address": "h:1", "required": "yes"}]}, "plugins[0].required"),
        ({"pluginMaxMessageBytes": 0}, "pluginMaxMessageBytes"),
        ({"dataDir": 3}, "dataDir"),
        ({"agents": [{"id": "a", "resumeSessionId": 7}]}, "agents[0].resumeSessionId"),
        ({"agents": {"id": "a"}}, "agents"),
        ([1, 2], "config"),
        ({"agents": [{"id": "a b"}]}, "agents[0].id"),
        ({"agents": [{"id": ""}]}, "agents[0].id"),
        ({"agents": [{"id": "a"}, {"id": "x" * 129}]}, "agents[1].id"),
        ({"agents": [{"id": "a/b"}]}, "agents[0].id"),
        ({"defaultProvider": "openai"}, "defaultProvider"),
        ({"agents": [{"id": "a", "provider": "openai"}]}, "agents[0].provider"),
        (
            {
                "providers": [{"name": "p", "baseUrl": "http://x"}],
                "agents": [{"id": "a", "provider": "q"}],
            },
            "agents[0].provider",
        ),
        ({"agents": [{"id": "a", "tools": ["word_count", "wordcount"]}]}, "agents[0].tools"),
        ({"agents": [{"id": "a", "tools": ["rm_rf"]}]}, "agents[0].tools"),
        ({"agents": [{"id": "a", "persona": "You are {{nme}}."}]}, "agents[0].persona"),
        ({"agents": [{"id": "a", "persona": "Run {{ model }}."}]}, "agents[0].persona"),
        ({"agents": [{"id": "a", "persona": "{{Model}}"}]}, "agents[0].persona"),
    ],
)
def test_invalid_config_names_the_field(raw: object, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value).startswith(f"{field}:")


def test_providers_and_plugins_parse() -> None:
    config = parse_config(
        {
            "providers": [
                {"name": "deepseek", "baseUrl": "https://api.deepseek.com/v1",
                 "apiKeyEnv": "DEEPSEEK_API_KEY", "defaultModel": "deepseek-chat",
                 "headers": {"X-A": "1"}, "maxAttempts": 5}
            ],
            "plugins": [{"address": "127.0.0.1:50100", "order": -5, "failurePolicy": "fail_open"}],
        }
    )  # fmt: skip
    (provider,) = config.providers
    assert (provider.name, provider.default_model, provider.max_attempts) == (
        "deepseek", "deepseek-chat", 5
    )  # fmt: skip
    assert provider.headers == (("X-A", "1"),)
    (plugin,) = config.plugins
    assert (plugin.order, plugin.failure_policy) == (-5, "fail_open")
    assert not plugin.is_required()  # fail_open: turns never wait for it


def test_config_plugins_are_required_unless_said_otherwise() -> None:
    config = parse_config(
        {
            "pluginMaxMessageBytes": 1024,
            "plugins": [
                {"address": "h:1", "name": "gate"},
                {"address": "h:2", "required": False},
                {"address": "h:3", "failurePolicy": "fail_open", "required": True},
            ],
        }
    )
    assert config.plugin_max_message_bytes == 1024
    assert [p.is_required() for p in config.plugins] == [True, False, True]
    assert config.plugins[0].name == "gate"


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_config_agents_may_name_every_known_provider_tool_and_variable() -> None:
    config = parse_config(
        {
            "defaultProvider": "local",
            "providers": [{"name": "local", "baseUrl": "http://127.0.0.1:1/v1"}],
            "agents": [
                {"id": "a.b:c_d-1", "provider": "local", "cwd": "/w",
                 "tools": ["current_time", "echo", "sleep", "word_count"],
                 "persona": "You run {{model}} from {{provider}} in {{cwd}}; {{ is literal"},
                {"id": "s", "provider": "scripted"},
                {"id": "d"},
            ],
        }
    )  # fmt: skip
    assert config.default_provider == "local"
    assert [a.provider for a in config.agents] == ["local", "scripted", ""]
    assert config.agents[0].tools == ("current_time", "echo", "sleep", "word_count")


def test_a_persona_using_cwd_needs_an_agent_with_a_cwd() -> None:
    with pytest.raises(ConfigError, match=r'agents\[0\]\.persona: prompt variable "cwd"'):
        parse_config({"agents": [{"id": "a", "persona": "in {{cwd}}"}]})


def test_limits_are_read_from_their_section_and_checked() -> None:
    config = parse_config({"limits": {"maxContentBytes": 1000, "maxAgents": 2}})
    assert config.limits.max_content_bytes == 1000
    assert config.limits.max_agents == 2
    assert config.limits.max_streams == Limits().max_streams
    with pytest.raises(ConfigError, match="limits.maxAgents: must be a positive integer"):
        parse_config({"limits": {"maxAgents": 0}})
    with pytest.raises(ConfigError, match="limits.maxNope: unknown field"):
        parse_config({"limits": {"maxNope": 1}})
    seconds = parse_config({"limits": {"httpHeaderTimeoutSeconds": 2.5, "grpcMaxConnections": 9}})
    assert seconds.limits.http_header_timeout_seconds == 2.5
    assert seconds.limits.grpc_max_connections == 9
    with pytest.raises(ConfigError, match="limits.httpBodyTimeoutSeconds: must be a positive"):
        parse_config({"limits": {"httpBodyTimeoutSeconds": 0}})


def test_the_messages_say_what_is_known() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"agents": [{"id": "a", "tools": ["nope"]}]})
    assert str(info.value) == (
        "agents[0].tools: 'nope' is not a built-in tool"
        " (known: collect, current_time, delegate, echo, sleep, word_count)"
    )
    with pytest.raises(ConfigError) as info:
        parse_config({"agents": [{"id": "a", "persona": "{{nme}}"}]})
    assert str(info.value) == (
        'agents[0].persona: unknown prompt variable "nme" (known: provider, model, cwd)'
    )
    with pytest.raises(ConfigError) as info:
        parse_config({"defaultProvider": "gpt"})
    assert str(info.value) == "defaultProvider: 'gpt' is not a provider (known: scripted)"


def test_an_invalid_file_stops_the_server_at_start_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "agentloop.yaml"
    config.write_text("agents:\n  - id: helper\n    tools: [word_count, wordcount]\n")
    with pytest.raises(ConfigError, match=r"^agents\[0\]\.tools: 'wordcount'"):
        load_config(config)


def test_with_plugins_a_provider_may_be_one_a_plugin_serves() -> None:
    config = parse_config(
        {"plugins": [{"address": "127.0.0.1:50100"}],
         "agents": [{"id": "a", "provider": "plugin-echo"}]}
    )  # fmt: skip
    assert config.agents[0].provider == "plugin-echo"
    with pytest.raises(ConfigError, match=r"^agents\[0\]\.provider:"):
        parse_config({"agents": [{"id": "a", "provider": "plugin-echo"}]})


def test_tool_order_parses() -> None:
    config = parse_config({"toolOrder": ["word_count", "<unlisted-tools>", "echo"]})
    assert config.tool_order == ("word_count", "<unlisted-tools>", "echo")


def test_the_plugin_allowlist_is_loopback_by_default_and_checked() -> None:
    assert parse_config({}).plugin_allowlist == ("localhost:*", "127.0.0.0/8:*", "[::1]:*")
    config = parse_config({"pluginAllowlist": ["10.0.0.0/8:7000", "plugins.internal:*"]})
    assert config.plugin_allowlist == ("10.0.0.0/8:7000", "plugins.internal:*")
    with pytest.raises(ConfigError, match=r"pluginAllowlist\[0\]: '10.0.0.1:99999'"):
        parse_config({"pluginAllowlist": ["10.0.0.1:99999"]})
    with pytest.raises(ConfigError, match="pluginTokenPlaintext: must be true or false"):
        parse_config({"pluginTokenPlaintext": "yes"})


def test_the_plugin_allowlist_names_unix_sockets_by_path_or_directory() -> None:
    entries = ["unix:/run/agentloop/guard.sock", "unix:/run/plugins/*"]
    assert parse_config({"pluginAllowlist": entries}).plugin_allowlist == tuple(entries)
    allowlist = Allowlist.of(tuple(entries))
    allowed = ("unix:/run/agentloop/guard.sock", "unix:/run/plugins/a.sock")
    for text in allowed:
        allowlist.check(parse_address(text, unix_allowed=True), text)
    # Not the exact socket, nor below the directory, nor by a host pattern.
    for text, entries_ in (
        ("unix:/run/agentloop/other.sock", entries),
        ("unix:/run/plugins/sub/a.sock", entries),
        ("unix:/run/agentloop/guard.sock", ["*:*", "localhost:*"]),
    ):
        with pytest.raises(InvalidArgument, match="a Unix socket must be named"):
            Allowlist.of(tuple(entries_)).check(parse_address(text, unix_allowed=True), text)
    assert parse_address("unix:/run/a.sock", unix_allowed=True).loopback
    with pytest.raises(ConfigError, match=r"pluginAllowlist\[0\]: 'unix:run/\*': a Unix socket"):
        parse_config({"pluginAllowlist": ["unix:run/*"]})
    with pytest.raises(InvalidArgument, match="the port must be 1-65535"):  # only where allowed
        parse_address("unix:/run/a.sock")


def test_tls_files_come_in_pairs() -> None:
    config = parse_config({"tlsCertFile": "c.pem", "tlsKeyFile": "k.pem", "tlsClientCaFile": "ca"})
    assert (config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file) == (
        "c.pem", "k.pem", "ca",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="tlsCertFile, tlsKeyFile: set both or neither"):
        parse_config({"tlsCertFile": "c.pem"})
    with pytest.raises(ConfigError, match="tlsClientCaFile: needs tlsCertFile"):
        parse_config({"tlsClientCaFile": "ca.pem"})


def test_a_file_without_agents_keeps_the_demo_agent(tmp_path: Path) -> None:
    only_listen = tmp_path / "listen.yaml"
    only_listen.write_text("listen: 127.0.0.1:6000\n")
    assert load_config(only_listen).agents == (DEFAULT_AGENT,)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty).agents == (DEFAULT_AGENT,)
    none = tmp_path / "none.yaml"
    none.write_text("listen: 127.0.0.1:6000\nagents: []\n")
    assert load_config(none).agents == ()
