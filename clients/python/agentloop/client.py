"""Connect to an agentloop server, over plaintext or TLS, with a token or a client cert.

Plaintext is for loopback; elsewhere TLS with a CA file, optionally with a client
certificate (mutual TLS), and the server's bearer token:

    client = connect("agents.example:50051", token=token, ca_file="ca.pem")
    await client.agents.SendMessage(api.SendMessageRequest(agent_id="a", text="hi"))
    await client.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from agentloop.plugin.v1 import plugin_registry_service_pb2_grpc
from agentloop.v1 import agent_factory_service_pb2_grpc, agent_service_pb2_grpc

if TYPE_CHECKING:
    from agentloop.plugin.v1.plugin_registry_service_pb2_grpc import (
        PluginRegistryServiceAsyncStub,
    )
    from agentloop.v1.agent_factory_service_pb2_grpc import AgentFactoryServiceAsyncStub
    from agentloop.v1.agent_service_pb2_grpc import AgentServiceAsyncStub

MAX_RECEIVE_BYTES = 4 * 1024 * 1024
"""gRPC's default receive limit; the server bounds every event well under it."""


@dataclass
class Client:
    """A channel to a server and its service stubs."""

    channel: grpc.aio.Channel

    @property
    def factory(self) -> AgentFactoryServiceAsyncStub:
        """Create, resume, list and dispose agents."""
        return agent_factory_service_pb2_grpc.AgentFactoryServiceStub(self.channel)

    @property
    def agents(self) -> AgentServiceAsyncStub:
        """Talk to agents and read their sessions."""
        return agent_service_pb2_grpc.AgentServiceStub(self.channel)

    @property
    def registry(self) -> PluginRegistryServiceAsyncStub:
        """Register and list plugins."""
        return plugin_registry_service_pb2_grpc.PluginRegistryServiceStub(self.channel)

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()


def connect(
    address: str,
    *,
    token: str = "",
    ca_file: str = "",
    cert_file: str = "",
    key_file: str = "",
    tls: bool | None = None,
) -> Client:
    """A client of the server at `address` (host:port).

    Args:
        address: host:port of the server.
        token: The server's bearer token, sent on every call ("" sends none).
        ca_file: PEM roots that the server's certificate must chain to; implies TLS.
        cert_file: This client's PEM certificate chain (mutual TLS), with `key_file`.
        key_file: The private key of `cert_file`.
        tls: Force TLS on (with the system's roots when no `ca_file`) or off; None means
            TLS exactly when a CA file or a client certificate is given.
    """
    options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
    use_tls = tls if tls is not None else bool(ca_file or cert_file)
    if not use_tls:
        interceptors = [BearerToken(token)] if token else None
        return Client(grpc.aio.insecure_channel(address, options, interceptors=interceptors))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file),
        private_key=_read(key_file),
        certificate_chain=_read(cert_file),
    )
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return Client(grpc.aio.secure_channel(address, credentials, options))


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
