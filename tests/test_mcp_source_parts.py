"""The parts of an MCP tool source that need no server: config, names, result mapping."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from mcp_types import CallToolResult, ImageContent, ResourceLink, TextContent

from server.kernel.tools import Tool, ToolRegistry, ToolReturn
from server.mcp import naming
from server.mcp.results import tool_return
from server.settings.config import ConfigError, parse_config


def test_a_server_is_a_command_or_a_url() -> None:
    config = parse_config(
        {
            "mcpServers": [
                {"name": "files", "command": "mcp-files", "args": ["--root", "/srv"]},
                {"name": "web", "url": "https://mcp.example/mcp", "tokenEnv": "WEB_TOKEN",
                 "headers": {"X-Team": "a"}},
            ]
        }
    )  # fmt: skip
    files, web = config.mcp_servers
    assert (files.command, files.args, files.timeout_seconds) == (
        "mcp-files",
        ("--root", "/srv"),
        60,
    )
    assert (web.url, web.token_env, web.headers) == (
        "https://mcp.example/mcp",
        "WEB_TOKEN",
        (("X-Team", "a"),),
    )


OAUTH = {"clientId": "a", "clientSecretEnv": "S", "issuer": "http://h"}


def test_oauth_client_credentials_and_the_health_settings() -> None:
    [web] = parse_config(
        {"mcpServers": [{"name": "web", "url": "https://mcp.example/mcp", "oauth": OAUTH,
                         "protocol": "legacy", "healthCheckSeconds": 5, "healthTimeoutSeconds": 2}]}
    ).mcp_servers  # fmt: skip
    assert web.oauth is not None
    assert (web.oauth.client_id, web.oauth.client_secret_env, web.oauth.issuer) == (
        "a",
        "S",
        "http://h",
    )
    assert (web.oauth.scope, web.oauth.auth_method) == ("", "client_secret_basic")
    assert (web.protocol, web.health_check_seconds, web.health_timeout_seconds) == ("legacy", 5, 2)


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ([{"name": "x"}], "mcpServers[0].command, url: set exactly one of command"),
        ([{"name": "x", "command": "c", "url": "http://h/mcp"}], "set exactly one of"),
        ([{"name": "x", "url": "ftp://h"}], "mcpServers[0].url: 'ftp://h' must start with http"),
        ([{"name": "a b", "command": "c"}], "mcpServers[0].name: 'a b' must be 1 to 32"),
        ([{"name": "x", "command": "c", "tokenEnv": "T"}], "headers, tokenEnv and oauth are for"),
        (
            [{"name": "x", "url": "http://h/mcp", "tokenEnv": "T", "oauth": OAUTH}],
            "mcpServers[0].tokenEnv, oauth: set at most one",
        ),
        (
            [{"name": "x", "url": "http://h/mcp", "oauth": {"clientSecretEnv": "S"}}],
            "mcpServers[0].oauth.clientId",
        ),
        (
            [{"name": "x", "url": "http://h/mcp", "oauth": {**OAUTH, "authMethod": "jwt"}}],
            "mcpServers[0].oauth.authMethod: 'jwt' must be",
        ),
        ([{"name": "x", "command": "c", "protocol": "2024"}], "mcpServers[0].protocol: '2024'"),
        ([{"name": "x", "command": "c", "healthCheckSeconds": -1}], "[0].healthCheckSeconds"),
        (
            [{"name": "x", "command": "c"}, {"name": "x", "command": "d"}],
            "mcpServers[1].name: duplicate",
        ),
        ([{"name": "x", "command": "c", "timeoutSeconds": 0}], "mcpServers[0].timeoutSeconds"),
    ],
)
def test_bad_servers_are_refused_naming_the_field(servers: list[object], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"mcpServers": servers})
    assert message in str(refused.value)


def test_names_and_opt_ins() -> None:
    assert naming.model_name("files", "read.file") == "mcp__files__read_file"
    assert len(naming.model_name("s", "t" * 100)) == naming.MAX_MODEL_NAME
    assert naming.enables("files", "read", ["mcp:files/read"])
    assert naming.enables("files", "read", ["mcp:files/*"])
    assert naming.enables("files", "read", ["mcp:*/re*"])
    assert not naming.enables("files", "read", ["mcp:files/write", "read", "mcp__files__read"])
    assert naming.accepts("mcp:files/read", ["files"])
    assert naming.accepts("mcp:f*/x", ["files"])
    assert not naming.accepts("mcp:other/read", ["files"])
    assert not naming.accepts("mcp:files/", ["files"])
    assert not naming.accepts("files/read", ["files"])


def test_the_registry_takes_opt_in_rules_and_predicates() -> None:
    registry = ToolRegistry()

    async def body(_: object) -> str:
        return ""

    registry.register(
        Tool(
            name="mcp__files__read", description="", input_schema={}, execute=body,
            enabled_by=lambda enabled: naming.enables("files", "read", enabled),
        )
    )  # fmt: skip
    assert "mcp:files/*" not in registry.enableable()
    dispose = registry.name_rule(lambda name: naming.accepts(name, ["files"]))
    assert "mcp:files/*" in registry.enableable() and "mcp__files__read" in registry.enableable()
    assert "mcp:other/*" not in registry.enableable()
    assert set(registry.visible("a", ["mcp:files/*"])) == {"mcp__files__read"}
    assert set(registry.visible("a", ["mcp__files__read"])) == {"mcp__files__read"}
    assert registry.visible("a", ["mcp:files/write"]) == {}
    dispose()
    assert "mcp:files/*" not in registry.enableable()


def texts_of(returned: ToolReturn) -> list[str]:
    assert isinstance(returned.content, list)
    return [block.text.text for block in returned.content]


def test_results_map_to_text_with_the_rest_in_meta() -> None:
    png = base64.b64encode(b"\x89PNG....").decode()
    result = CallToolResult(
        content=[
            TextContent(type="text", text="hello"),
            ImageContent(type="image", data=png, mime_type="image/png"),
            ResourceLink(type="resource_link", name="notes", uri="file:///notes.txt"),
        ],
        structured_content={"n": 1},
        is_error=True,
    )
    returned = tool_return(result, "box", "t", 1000)
    texts = texts_of(returned)
    assert texts == [
        "hello",
        "[image image/png, 8 bytes; kept in the call's meta]",
        "[resource notes](file:///notes.txt)",
    ]
    assert returned.is_error
    assert returned.meta == {
        "mcp": {
            "server": "box",
            "tool": "t",
            "content": [{"type": "image", "data": png, "mimeType": "image/png"}],
            "structuredContent": {"n": 1},
        }
    }


def test_structured_content_alone_is_shown_as_json_and_text_is_bounded() -> None:
    only = CallToolResult(content=[], structured_content={"b": 2, "a": 1})
    assert texts_of(tool_return(only, "s", "t", 100)) == ['{"a": 1, "b": 2}']
    long = CallToolResult(content=[TextContent(type="text", text="ab" * 10)] * 2)
    assert texts_of(tool_return(long, "s", "t", 25)) == [
        "ab" * 10,
        "ababa\n[truncated: 25 of 40 characters shown; the result was over the limit]",
    ]


def test_the_readme_example_is_a_valid_config() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## MCP servers: tools from any Model Context Protocol server")[1]
    example = section.split("```yaml\n")[1].split("```")[0]
    config = parse_config(yaml.safe_load(example))
    assert [s.name for s in config.mcp_servers] == ["files", "tracker", "docs"]
    docs = config.mcp_servers[2]
    assert docs.oauth is not None and docs.oauth.issuer == "https://auth.docs.example"
    assert config.agents[0].tools == ("word_count", "mcp:files/*", "mcp:tracker/search_issues")
