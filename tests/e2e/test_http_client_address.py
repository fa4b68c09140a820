"""The access log names the HTTP client, not the HTTP side's private socket: the
connection's peer, or the client a trusted proxy names in `X-Forwarded-For`."""

from __future__ import annotations

import logging
from dataclasses import replace

import httpx
import pytest

from agentloop.v1 import agent_factory_service_pb2 as fac
from server.edge.client_address import client_address, trusted_networks
from server.settings.config import Config
from tests.e2e.conftest import READ_TIMEOUT, running_app

T = READ_TIMEOUT
LIST = "/api/agentloop.v1.AgentFactoryService/ListAgents"

pytestmark = pytest.mark.usefixtures("without_tokens")


def access_peers(caplog: pytest.LogCaptureFixture, method: str) -> list[str]:
    return [
        str(getattr(r, "peer", ""))
        for r in caplog.records
        if r.name == "agentloop.access" and getattr(r, "method", "") == method
    ]


@pytest.mark.parametrize("trusted", [(), ("127.0.0.1", "10.0.0.0/8")])
async def test_the_access_log_names_the_http_client(
    trusted: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentloop.access")
    config = Config(listen="127.0.0.1:0", store="memory", agents=())
    config = replace(config, http_listen="127.0.0.1:0", trusted_proxies=trusted)
    async with running_app(config) as e2e:
        assert e2e.app.http is not None
        base = f"http://127.0.0.1:{e2e.app.http.port}"
        async with httpx.AsyncClient(base_url=base, timeout=T) as http:
            plain = await http.post(LIST, json={})
            forwarded = await http.post(
                LIST, json={}, headers={"X-Forwarded-For": "198.51.100.9, 203.0.113.7, 10.1.2.3"}
            )
        assert plain.status_code == forwarded.status_code == 200
        # A gRPC client cannot pass for the HTTP side: its relay metadata is not believed.
        await e2e.factory.ListAgents(
            fac.ListAgentsRequest(),
            metadata=(("agentloop-http-client", "ipv4:6.6.6.6"), ("agentloop-http-relay", "x")),
            timeout=T,
        )
    plain_peer, forwarded_peer, grpc_peer = access_peers(
        caplog, "/agentloop.v1.AgentFactoryService/ListAgents"
    )
    assert plain_peer.startswith("ipv4:127.0.0.1:") and not plain_peer.endswith(":0")
    if trusted:  # the first hop from the right that is not a trusted proxy
        assert forwarded_peer == "ipv4:203.0.113.7"
    else:  # no proxy is trusted: the header is ignored
        assert forwarded_peer.startswith("ipv4:127.0.0.1:")
    assert grpc_peer.startswith("ipv4:127.0.0.1:") and "6.6.6.6" not in grpc_peer
    assert not any(p.startswith("unix:") for p in (plain_peer, forwarded_peer, grpc_peer))


def test_forwarded_for_is_read_from_the_right_and_only_from_a_trusted_proxy() -> None:
    trusted = trusted_networks(["10.0.0.0/8", "::1"])
    assert client_address("10.0.0.5", 4000, "1.2.3.4", trusted) == "ipv4:1.2.3.4"
    assert client_address("10.0.0.5", 4000, "9.9.9.9, 1.2.3.4, 10.0.0.9", trusted) == (
        "ipv4:1.2.3.4"
    )
    assert client_address("192.0.2.1", 4000, "1.2.3.4", trusted) == "ipv4:192.0.2.1:4000"
    assert client_address("::1", 4000, "2001:db8::7", trusted) == "ipv6:[2001:db8::7]"
    assert client_address("10.0.0.5", 4000, "10.0.0.6, 10.0.0.7", trusted) == "ipv4:10.0.0.6"
    assert client_address("10.0.0.5", 4000, "junk\nline", trusted) == "ipv4:10.0.0.5:4000"
    assert client_address("10.0.0.5", 4000, "", trusted) == "ipv4:10.0.0.5:4000"


def test_a_trusted_proxy_must_be_an_address_or_a_block() -> None:
    with pytest.raises(ValueError, match="not an IP address or a CIDR block"):
        Config(trusted_proxies=("proxy.example",))
