"""The toolbox as an OAuth-protected MCP server, with its own authorization server.

One port serves both: the MCP endpoint `/mcp` (bearer tokens required, checked by
the `mcp` package's resource-server side, which also publishes the protected
resource metadata) and a minimal authorization server, written here: its metadata
(`/.well-known/oauth-authorization-server`) and a token endpoint that grants
`client_credentials` to `CLIENT_ID`/`CLIENT_SECRET` (HTTP basic) with tokens that
live `TOKEN_SECONDS`. Each token issued is a line in `DIR/tokens`.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

CLIENT_ID = "agentloop-tests"
CLIENT_SECRET = "the-client-secret"
TOKEN_SECONDS = 3
"""A short life: the tests see a token renewed."""


class IssuedTokens:
    """The tokens this authorization server issued, with when they expire."""

    def __init__(self, marks: Path) -> None:
        self._expiry: dict[str, float] = {}
        self._marks = marks

    def issue(self) -> str:
        token = secrets.token_urlsafe(16)
        self._expiry[token] = time.time() + TOKEN_SECONDS
        with (self._marks / "tokens").open("a") as issued:
            issued.write(f"{token}\n")
        return token

    async def verify_token(self, token: str) -> AccessToken | None:
        """The resource server's check: issued here and not expired."""
        expiry = self._expiry.get(token)
        if expiry is None or expiry < time.time():
            return None
        return AccessToken(token=token, client_id=CLIENT_ID, scopes=[], expires_at=int(expiry))


def client_of(request: Request, form: Any) -> tuple[str, str]:
    """The client id and secret, from HTTP basic or from the form."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("basic "):
        client_id, _, secret = base64.b64decode(header[6:]).decode().partition(":")
        return client_id, secret
    return str(form.get("client_id", "")), str(form.get("client_secret", ""))


def protected_app(build: Callable[..., MCPServer], port: int, marks: Path) -> Any:
    """The ASGI app: the toolbox behind bearer tokens, and the authorization server."""
    issuer = f"http://127.0.0.1:{port}"
    tokens = IssuedTokens(marks)
    server = build(
        auth=AuthSettings(
            issuer_url=issuer,  # type: ignore[arg-type]
            resource_server_url=f"{issuer}/mcp",  # type: ignore[arg-type]
            validate_token_resource=False,
        ),
        token_verifier=tokens,
    )

    async def metadata(_: Request) -> Response:
        return JSONResponse(
            {
                "issuer": issuer,
                "authorization_endpoint": f"{issuer}/authorize",
                "token_endpoint": f"{issuer}/token",
                "response_types_supported": ["code"],
                "grant_types_supported": ["client_credentials"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            }
        )

    async def token(request: Request) -> Response:
        form = await request.form()
        if form.get("grant_type") != "client_credentials":
            return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
        if client_of(request, form) != (CLIENT_ID, CLIENT_SECRET):
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        return JSONResponse(
            {"access_token": tokens.issue(), "token_type": "Bearer", "expires_in": TOKEN_SECONDS}
        )

    # Routes the bearer tokens do not guard (the SDK's decorator, called plainly).
    server.custom_route("/.well-known/oauth-authorization-server", methods=["GET"])(metadata)
    server.custom_route("/token", methods=["POST"])(token)
    return server.streamable_http_app()
