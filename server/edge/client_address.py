"""The address of an HTTP client, as the access log names it.

Behind a reverse proxy every connection comes from the proxy; the proxy names the
client in `X-Forwarded-For`. That header is believed only when the connection comes
from a configured trusted proxy (`trustedProxies`), and then read from the right:
the first address that is not itself a trusted proxy is the client (addresses to its
left were written by the client, who may lie). Otherwise the connection's own peer
is the client. Addresses are written as gRPC writes a peer (`ipv4:…`, `ipv6:[…]:…`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(proxies: Sequence[str]) -> tuple[Network, ...]:
    """The networks of `trustedProxies` entries (an IP or a CIDR block each)."""
    return tuple(ipaddress.ip_network(proxy, strict=False) for proxy in proxies)


def peer_text(host: str, port: int | None = None) -> str:
    """`host` (and `port`) as gRPC names a peer."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.version == 6:
        return f"ipv6:[{ip}]" + (f":{port}" if port is not None else "")
    return f"ipv4:{ip}" + (f":{port}" if port is not None else "")


def client_address(
    peer_host: str, peer_port: int | None, forwarded_for: str, trusted: Sequence[Network]
) -> str:
    """The client's address: from `X-Forwarded-For` via a trusted proxy, else the peer."""
    if not forwarded_for or not _trusted(peer_host, trusted):
        return peer_text(peer_host, peer_port)
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _is_ip(hop):  # not an address: the proxy is the last hop known
            return peer_text(peer_host, peer_port)
        if not _trusted(hop, trusted):
            return peer_text(hop)
    return peer_text(hops[0]) if hops else peer_text(peer_host, peer_port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _trusted(host: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(ip in network for network in trusted)
