"""Every size and count limit of the server, in one place, with its default.

A limit protects the other users of a server from one request or one agent: each is
refused with a status (or, inside a turn, an `error` turn end) whose message names the
limit as it is spelled in the config's `limits:` section, and its value.
"""

from __future__ import annotations

from dataclasses import fields

from pydantic.dataclasses import dataclass

from server.kernel.errors import CodedError, InvalidArgument, ResourceExhausted
from server.kernel.schema import SCHEMA, PositiveInt, PositiveSeconds

MIB = 1024 * 1024


@dataclass(frozen=True, config=SCHEMA)
class Limits:
    """The limits of one server; the config's `limits:` section overrides the defaults."""

    max_request_bytes: PositiveInt = 4 * MIB
    """The largest request message the server decodes (gRPC's own default)."""
    max_content_bytes: PositiveInt = 1 * MIB
    """Content of one SendMessage/SteerMessage/InjectContext, and one scripted step.
    Well under the 4 MiB a default gRPC client receives, so any event carrying it fits."""
    max_persona_bytes: PositiveInt = 64 * 1024
    """An agent's persona (a system-prompt section rendered on every model request)."""
    max_script_steps: PositiveInt = 1000
    """Steps of a scripted agent's script (`ScriptedOptions.steps`)."""
    max_script_tool_calls: PositiveInt = 1000
    """Tool calls in all of a scripted agent's script."""
    max_agents: PositiveInt = 1000
    """Live agents per server."""
    max_tool_calls_per_step: PositiveInt = 128
    """Tool calls the model may ask for in one step; more ends the turn with `error`."""
    max_events_per_turn: PositiveInt = 200_000
    """Session events one turn may append; more ends the turn with `error`."""
    max_streams: PositiveInt = 1000
    """Concurrent StreamSessionEvents calls per server."""
    max_plugins: PositiveInt = 64
    """Registered plugins per server."""
    max_pending_messages: int = 1000
    """Accepted messages one agent holds that no turn has taken up yet."""
    # The ports (server/edge/port_bounds.py): what one client may hold of a listener.
    http_header_timeout_seconds: PositiveSeconds = 10.0
    """From a connection's accept (or its last answer) to a request's complete headers."""
    http_body_timeout_seconds: PositiveSeconds = 30.0
    """From a request's headers to its complete body."""
    http_idle_timeout_seconds: PositiveSeconds = 60.0
    """A keep-alive HTTP connection with no request in flight is closed after this."""
    http_max_connections: PositiveInt = 1000
    """Open connections to `httpListen`; one more is answered 503 and closed."""
    http_max_connections_per_client: PositiveInt = 100
    """Open connections to `httpListen` from one client address."""
    grpc_max_connections: PositiveInt = 1000
    """Open connections to the gRPC port (the HTTP side's own count too); more are closed."""
    grpc_max_concurrent_streams: PositiveInt = 2000
    """Calls in flight on one gRPC connection (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`):
    above `max_streams`, so one client following every agent on one channel still calls."""
    grpc_max_connection_idle_seconds: PositiveSeconds = 300.0
    """A gRPC connection with no call in flight this long is sent GOAWAY."""
    grpc_max_connection_age_seconds: PositiveSeconds = 3600.0
    """A gRPC connection older than this is sent GOAWAY (clients reconnect: load spreads)."""
    grpc_max_connection_age_grace_seconds: PositiveSeconds = 300.0
    """How long the calls of a connection past its age may still run before it is closed."""
    grpc_keepalive_min_interval_seconds: PositiveSeconds = 60.0
    """The shortest interval between a client's keepalive pings; faster ones are strikes
    and the third strike closes the connection (GOAWAY `too_many_pings`)."""
    grpc_keepalive_time_seconds: PositiveSeconds = 120.0
    """The server pings a connection silent this long, and closes it if no answer comes
    within 20 s: a client gone without a FIN does not hold its connection forever."""
    max_agent_depth: PositiveInt = 4
    """How deep sub-agents nest: a child of a top-level agent has depth 1."""
    max_children_per_agent: PositiveInt = 16
    """Live sub-agents one agent owns at once."""

    def name_of(self, attribute: str) -> str:
        """The config spelling of a limit: `max_content_bytes` -> `maxContentBytes`."""
        head, *rest = attribute.split("_")
        return head + "".join(word.capitalize() for word in rest)

    def describe(self, attribute: str) -> str:
        """`limits.maxContentBytes (1048576)`: how a refusal names a limit."""
        return f"limits.{self.name_of(attribute)} ({getattr(self, attribute)})"


DEFAULT_LIMITS = Limits()

LIMIT_FIELDS = {DEFAULT_LIMITS.name_of(f.name): f.name for f in fields(Limits)}
"""Config name -> attribute, for the config parser."""

TOOL_CALLS_PER_STEP = "TOOL_CALLS_PER_STEP"
"""The `turn_end.error.code` of a step whose model asked for too many tool calls."""
EVENTS_PER_TURN = "EVENTS_PER_TURN"
"""The `turn_end.error.code` of a turn that appended too many events."""
CONTENT_BYTES = "CONTENT_BYTES"
"""The code of a model message or tool result over `maxContentBytes`."""


def check_size(limits: Limits, attribute: str, field: str, size: int, unit: str = "bytes") -> None:
    """`InvalidArgument` naming `field` and the limit when `size` exceeds it."""
    limit: int = getattr(limits, attribute)
    if size > limit:
        raise InvalidArgument(
            field, f"has {size} {unit}, over the limit {limits.describe(attribute)}"
        )


def check_capacity(limits: Limits, attribute: str, current: int, what: str) -> None:
    """`ResourceExhausted` when `current` already reached the limit."""
    limit: int = getattr(limits, attribute)
    if current >= limit:
        raise ResourceExhausted(
            f"{what}: the server reached {limits.describe(attribute)}", limit=attribute
        )


def check_pending(limits: Limits, agent_id: str, pending: int) -> None:
    """`ResourceExhausted` when the agent already holds as many waiting messages as allowed."""
    if pending >= limits.max_pending_messages:
        raise ResourceExhausted(
            f'agent "{agent_id}" has {pending} messages waiting for a turn:'
            f" {limits.describe('max_pending_messages')}; retry when it has taken some up",
            limit="max_pending_messages",
            agent_id=agent_id,
        )


def check_tool_calls(limits: Limits, count: int) -> None:
    """End the step (`CodedError`) when the model asked for more tool calls than allowed."""
    if count > limits.max_tool_calls_per_step:
        raise CodedError(
            f"the model asked for {count} tool calls in one step;"
            f" {limits.describe('max_tool_calls_per_step')}",
            TOOL_CALLS_PER_STEP,
        )


def check_turn_events(limits: Limits, appended: int) -> None:
    """End the turn (`CodedError`) once it appended more events than allowed."""
    if appended > limits.max_events_per_turn:
        raise CodedError(
            f"the turn appended {appended} events; {limits.describe('max_events_per_turn')}",
            EVENTS_PER_TURN,
        )


def check_model_output(limits: Limits, size: int) -> None:
    """End the step (`CodedError`) once a model's message passed `maxContentBytes`.

    The message becomes one event: bounded, it fits what any default client receives.
    """
    if size > limits.max_content_bytes:
        raise CodedError(
            f"the model's message passed {size} bytes; {limits.describe('max_content_bytes')}",
            CONTENT_BYTES,
        )


def oversized_result(limits: Limits, size: int) -> str:
    """The error text replacing a tool result of `size` bytes; "" when it fits."""
    if size <= limits.max_content_bytes:
        return ""
    return (
        f"Error: the tool result has {size} bytes, over the limit"
        f" {limits.describe('max_content_bytes')}"
    )
