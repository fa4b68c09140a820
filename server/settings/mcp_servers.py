"""The `mcpServers` entries of the server config: how to reach each MCP server."""

from __future__ import annotations

import re
from typing import Annotated, Self

from pydantic import model_validator
from pydantic.dataclasses import dataclass

from server.kernel.schema import SCHEMA, PositiveInt, PositiveSeconds, fail, rule
from server.settings.fields import Flag, Pairs, Text, one_of

SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
"""A server's name: it becomes part of tool names (`mcp__<server>__<tool>`)."""


def _name_problem(name: str) -> str:
    if SERVER_NAME.fullmatch(name):
        return ""
    return f"{name!r} must be 1 to 32 letters, digits, '_' or '-'"


def _url_problem(url: str) -> str:
    if not url or url.startswith(("http://", "https://")):
        return ""
    return f"{url!r} must start with http:// or https://"


@dataclass(frozen=True, config=SCHEMA)
class McpOAuthConfig:
    """OAuth 2.1 client credentials for a Streamable HTTP server (no user in the loop).

    The authorization server is found from the MCP server's 401 (its protected
    resource metadata, then the authorization server's metadata); its token endpoint
    gives an access token for `clientId` and the secret, fetched again when it expires.
    """

    client_id: Text
    """The client id registered with the authorization server."""
    client_secret_env: Text
    """An environment variable holding the client secret (read at each connection)."""
    issuer: Text
    """The authorization server the credentials belong to (its issuer identifier): the
    token is asked of no other, whatever the MCP server advertises."""
    scope: Text = ""
    """The scopes asked for, space-separated; empty: the server's."""
    auth_method: Annotated[Text, one_of("client_secret_basic", "client_secret_post")] = (
        "client_secret_basic"
    )
    """How the secret reaches the token endpoint."""


@dataclass(frozen=True, config=SCHEMA)
class McpServerConfig:
    """One MCP server: a command run over stdio, or a Streamable HTTP URL."""

    name: Annotated[Text, rule(_name_problem)]
    """How agents name its tools: `mcp:<name>/<tool>`."""
    command: Text = ""
    """The program of a stdio server."""
    args: tuple[Text, ...] = ()
    """Its arguments."""
    env: Pairs = ()
    """Environment variables set for it (over a minimal default environment)."""
    cwd: Text = ""
    """Its working directory; empty: the server's."""
    url: Annotated[Text, rule(_url_problem)] = ""
    """The endpoint of a Streamable HTTP server."""
    headers: Pairs = ()
    """HTTP headers sent with every request."""
    token_env: Text = ""
    """An environment variable whose value is sent as `Authorization: Bearer ...`."""
    oauth: McpOAuthConfig | None = None
    """OAuth client credentials (a url server only; not with tokenEnv)."""
    protocol: Annotated[Text, one_of("auto", "legacy")] = "auto"
    """`auto`: the 2026-07-28 revision when the server speaks it, else the initialize
    handshake; `legacy`: always the handshake (for a server that mishandles the probe)."""
    timeout_seconds: PositiveSeconds = 60.0
    """How long one tool call may take; then it is cancelled at the server and fails."""
    connect_timeout_seconds: PositiveSeconds = 10.0
    """How long a call waits for the server to (re)connect before it fails."""
    refresh_seconds: PositiveSeconds = 60.0
    """How often the tool list is re-read when the server cannot notify changes."""
    health_check_seconds: PositiveSeconds = 30.0
    """How often a connected server's health is checked (a `tools/list` round trip), and
    at once after a call times out."""
    health_timeout_seconds: PositiveSeconds = 10.0
    """How long a health check may take; a server that does not answer is restarted."""
    max_result_chars: PositiveInt = 100_000
    """The most text of one result the model sees; the rest is cut with a note."""
    trust_annotations: Flag = False
    """Believe the server's tool annotations: a read-only tool then runs in parallel."""

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        """Exactly one of `command` and `url`."""
        if bool(self.command) == bool(self.url):
            fail("set exactly one of command (stdio) or url (Streamable HTTP)", "command, url")
        if self.command and (self.headers or self.token_env or self.oauth):
            fail("headers, tokenEnv and oauth are for url servers", "headers, tokenEnv, oauth")
        if self.token_env and self.oauth:
            fail("set at most one of tokenEnv and oauth", "tokenEnv, oauth")
        return self
