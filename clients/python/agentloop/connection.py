"""A channel to an agentloop server: plaintext on loopback, TLS elsewhere, with a token.

Plaintext is for loopback; elsewhere TLS with a CA file, optionally with a client
certificate (mutual TLS), and the server's bearer token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from agentloop.retrying import RetryUnavailable

MAX_RECEIVE_BYTES = 4 * 1024 * 1024
"""gRPC's default receive limit; the server bounds every event well under it."""
MAX_RECONNECT_BACKOFF_MS = 3000
"""The longest wait between two attempts to reach a server that went away (gRPC's own
default grows to 120 s: a server back after a restart would go unnoticed that long)."""


def open_channel(
    address: str,
    *,
    token: str = "",
    ca_file: str = "",
    cert_file: str = "",
    key_file: str = "",
    tls: bool | None = None,
) -> grpc.aio.Channel:
    """A channel to `address` (host:port); the arguments as for `agentloop.connect`."""
    options = [
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]
    use_tls = tls if tls is not None else bool(ca_file or cert_file)
    retry = RetryUnavailable()  # AGENT_MOVING, STORE_UNAVAILABLE: again, same request id
    if not use_tls:
        interceptors: list[Any] = [retry, BearerToken(token)] if token else [retry]
        return grpc.aio.insecure_channel(address, options, interceptors=interceptors)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file),
        private_key=_read(key_file),
        certificate_chain=_read(cert_file),
    )
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return grpc.aio.secure_channel(address, credentials, options, interceptors=[retry])


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


class BearerToken(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call of a plaintext channel.

    gRPC's own token credentials refuse plaintext; plaintext is meant for loopback only.
    """

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._metadata)
        return details._replace(metadata=metadata)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        """A unary call with the token."""
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        """A streaming call with the token."""
        return await continuation(self._details(details), request)
