"""What one client may hold of the gRPC port: gRPC's own server arguments, from the limits.

Connections (total, idle, age and its grace), streams per connection, and keepalive
enforcement (pings closer than the minimum interval are strikes). The HTTP side's
bounds are in `server/edge/port_bounds.py`.
"""

from __future__ import annotations

from server.kernel.limits import Limits

KEEPALIVE_ACK_SECONDS = 20
"""How long the server waits for the answer to its keepalive ping (gRPC's default)."""
PING_STRIKES = 2
"""Pings faster than allowed that a gRPC connection may send before it is closed."""


def grpc_options(limits: Limits) -> list[tuple[str, int]]:
    """The gRPC server arguments that bound its connections (all of its ports)."""

    def ms(seconds: float) -> int:
        return round(seconds * 1000)

    return [
        ("grpc.max_receive_message_length", limits.max_request_bytes),
        ("grpc.max_allowed_incoming_connections", limits.grpc_max_connections),
        ("grpc.max_concurrent_streams", limits.grpc_max_concurrent_streams),
        ("grpc.max_connection_idle_ms", ms(limits.grpc_max_connection_idle_seconds)),
        ("grpc.max_connection_age_ms", ms(limits.grpc_max_connection_age_seconds)),
        ("grpc.max_connection_age_grace_ms", ms(limits.grpc_max_connection_age_grace_seconds)),
        ("grpc.keepalive_time_ms", ms(limits.grpc_keepalive_time_seconds)),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_ACK_SECONDS * 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            ms(limits.grpc_keepalive_min_interval_seconds),
        ),
        ("grpc.http2.max_ping_strikes", PING_STRIKES),
    ]
