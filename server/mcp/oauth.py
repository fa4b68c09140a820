"""OAuth for Streamable HTTP MCP servers that a service reaches with no user present.

The `mcp` SDK's client-credentials provider does the protocol: on the server's 401
it reads the protected resource metadata and the authorization server's metadata,
asks the token endpoint for a token with the client's id and secret, sends it as a
bearer token, and asks again when it expires or is refused. What is kept here is
the token, across the reconnections of one source (in memory only: a restart of
agentloop asks for a new one). The interactive authorization-code flow is not used:
nobody is there to open a browser.
"""

from __future__ import annotations

import os

from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from server.settings.mcp_servers import McpOAuthConfig


class MemoryTokens:
    """One source's token (and its client information), kept in memory."""

    def __init__(self) -> None:
        self._tokens: OAuthToken | None = None
        self._client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        """The token last issued, if any."""
        return self._tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Keep a newly issued token."""
        self._tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        """The client information the provider stored."""
        return self._client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        """Keep the client information."""
        self._client = client_info


def client_credentials(
    url: str, config: McpOAuthConfig, tokens: MemoryTokens
) -> ClientCredentialsOAuthProvider:
    """The `httpx` auth of one connection to the server at `url`.

    The secret is read from its environment variable now (a rotated secret counts at
    the next connection).
    """
    return ClientCredentialsOAuthProvider(
        server_url=url,
        storage=tokens,
        client_id=config.client_id,
        client_secret=os.environ.get(config.client_secret_env, ""),
        token_endpoint_auth_method=config.auth_method,  # type: ignore[arg-type]
        scope=config.scope or None,
        issuer=config.issuer,
    )
