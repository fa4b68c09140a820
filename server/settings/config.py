"""Server configuration: a YAML file, validated at start with errors that name the field.

One schema: the dataclasses below declare every key once, with its type, its default and
its doc. A YAML key is the camelCase spelling of its field (`max_attempts` is
`maxAttempts`); a key nobody declared is an error naming its path. Adding a key is adding
a field. What makes an agent valid is `server/settings/agent_rules.py`'s, shared with `CreateAgent`.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import field, replace
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from agentloop.plugin.transport import MAX_MESSAGE_BYTES
from server.kernel.defaults import (
    DEFAULT_PROVIDER,
    MAX_PARALLEL_TOOL_CALLS,
    PLUGIN_TIMEOUT_SECONDS,
)
from server.kernel.ids import id_problem
from server.kernel.limits import Limits
from server.kernel.schema import SCHEMA, ConfigError, PositiveInt, PositiveSeconds, fail, rule
from server.kernel.tokens import DEFAULT_KEEP_RECENT, DEFAULT_OUTPUT_RESERVE
from server.kernel.tools import UNLISTED_TOOLS
from server.loop.builtin_tools import DELEGATION_TOOLS, builtin_tools
from server.loop.system_prompt import PERSONA_VARIABLES
from server.models.openai_wire import MAX_TOKENS_FIELDS
from server.settings import agent_rules as rules
from server.settings.addresses import DEFAULT_ALLOWLIST, parse_pattern
from server.settings.fields import (
    Flag,
    HostPort,
    Integer,
    NonNegativeSeconds,
    Pairs,
    PortText,
    Seconds,
    Text,
    config_error,
    one_of,
)
from server.settings.mcp_servers import McpServerConfig
from server.settings.prices import PriceConfig
from server.settings.profiles import SubagentProfile
from server.settings.retention import Retention

__all__ = [
    "AgentConfig", "Config", "ConfigError", "PluginConfig", "ProviderConfig", "SubagentProfile",
    "load_config",
    "http_address", "metrics_address", "override", "parse_config", "read_pem", "read_token",
]  # fmt: skip

DEFAULT_LISTEN = "127.0.0.1:50051"
BUILTIN_PROVIDER = DEFAULT_PROVIDER
FAILURE_POLICIES = ("fail_closed", "fail_open")
TRACE_EXPORTERS = ("", "none", "otlp", "console")
CLI_ONLY = ("insecure",)
"""Fields that only command-line flags set, never the file."""


def _tool_order_problem(names: tuple[str, ...] | None) -> str:
    if names is None:
        return ""
    if not all(names):
        return "must be a list of tool names"
    if names.count(UNLISTED_TOOLS) != 1:
        return f'must contain "{UNLISTED_TOOLS}" exactly once'
    return "names a tool twice" if len(set(names)) != len(names) else ""


def _pattern_problem(entry: str) -> str:
    try:
        parse_pattern(entry)
    except ValueError as error:
        return str(error)
    return ""


def _metrics(value: str) -> str:
    try:
        return metrics_address(value)
    except ConfigError as error:
        fail(str(error).removeprefix("metricsListen: "))


def _http(value: str) -> str:
    try:
        return http_address(value)
    except ConfigError as error:
        fail(str(error).removeprefix("httpListen: "))


def _proxy_problem(text: str) -> str:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return f"{text!r} is not an IP address or a CIDR block"
    return ""


def _base_url_problem(url: str) -> str:
    if url.startswith(("http://", "https://")):
        return ""
    return f"{url!r} must start with http:// or https://"


AgentId = Annotated[Text, rule(id_problem)]
AbsolutePath = Annotated[Text, rule(rules.cwd_problem)]
LeaseSeconds = Annotated[
    Seconds, rule(lambda s: "" if 1 <= s <= 300 else "must be a number of seconds from 1 to 300")
]
ToolOrder = Annotated[tuple[Text, ...] | None, rule(_tool_order_problem)]
AllowPattern = Annotated[Text, rule(_pattern_problem)]
ProxyAddress = Annotated[Text, rule(_proxy_problem)]
MetricsListen = Annotated[PortText, AfterValidator(_metrics)]
HttpListen = Annotated[PortText, AfterValidator(_http)]
ApprovalTimeout = Annotated[
    NonNegativeSeconds, rule(lambda s: "" if s <= 86400 else "must be a number from 0 to 86400")
]


@dataclass(frozen=True, config=SCHEMA)
class AgentConfig:
    """An agent created at start, on a fresh session `<id>-session-<uuid>`."""

    id: AgentId
    """The agent id."""
    provider: Text = ""
    """The model provider; empty means the server default."""
    model: Text = ""
    """The model name."""
    cwd: AbsolutePath = ""
    """The absolute working directory written into the session header."""
    tools: tuple[Text, ...] = ()
    """The tools the agent may use: registered ones (built-in, or a plugin's)."""
    persona: Text = ""
    """The persona section of the system prompt."""
    max_parallel_tool_calls: PositiveInt | None = None
    """The agent's parallel tool-call cap; None means the server's."""
    resume_session_id: Text = ""
    """Resume this stored session instead of creating one (cwd is then ignored)."""
    labels: Annotated[Pairs, rule(lambda pairs: rules.labels_problem(dict(pairs)))] = ()
    """The agent's labels (`AgentOptions.labels`), which plugins' conditions select by."""

    @model_validator(mode="after")
    def _persona(self) -> Self:
        # A resumed agent's cwd comes from its stored session: checked when it starts.
        values: dict[str, str | None] = dict.fromkeys(PERSONA_VARIABLES, "x")
        if not self.cwd and not self.resume_session_id:
            values["cwd"] = None
        problem = rules.persona_problem(self.persona, values)
        if problem:
            fail(problem, "persona")
        return self


@dataclass(frozen=True, config=SCHEMA)
class ProviderConfig:
    """An OpenAI-compatible model provider (the API key comes from the environment)."""

    name: Text
    """The name agents select with `provider`."""
    base_url: Annotated[Text, rule(_base_url_problem)]
    """The API root; requests go to `<base_url>/chat/completions`."""
    kind: Annotated[
        Text,
        rule(lambda k: "" if k == "openai" else f"{k!r} is not a provider type (known: openai)"),
    ] = Field(default="openai", alias="type")
    """The wire protocol (YAML `type`): "openai", the only one."""
    api_key_env: Text = ""
    """The environment variable holding the API key; empty: no key is sent."""
    default_model: Text = ""
    """The model of agents that name none."""
    headers: Pairs = ()
    """Extra request headers."""
    connect_timeout_seconds: PositiveSeconds = 10.0
    """TCP connect and TLS handshake."""
    read_timeout_seconds: PositiveSeconds = 300.0
    """The longest silence tolerated mid-request."""
    max_attempts: PositiveInt = 3
    """Attempts per request before the first chunk (1: never retry)."""
    initial_backoff_seconds: PositiveSeconds = 0.5
    """The first retry delay, doubled per retry."""
    max_backoff_seconds: PositiveSeconds = 8.0
    """The longest retry delay."""
    max_retry_after_seconds: PositiveSeconds = 60.0
    """The cap on a server's Retry-After."""
    max_tokens_field: Annotated[Text, one_of(*MAX_TOKENS_FIELDS)] = "auto"
    """How the output cap is sent: "max_tokens", "max_completion_tokens" (OpenAI's
    reasoning models need it), or "auto" (by model name)."""
    context_window_tokens: PositiveInt | None = None
    """The context window of this provider's models; unset: the built-in table of
    common models by name (`server/kernel/tokens.py`), else unknown (no automatic
    compaction unless an agent sets `context_window_tokens`)."""


@dataclass(frozen=True, config=SCHEMA)
class PluginConfig:
    """A plugin registered at start (and retried until it answers)."""

    address: Text
    """host:port, or tls://host:port."""
    order: Integer | None = None
    """Overrides the order of every subscription."""
    timeout_seconds: PositiveSeconds | None = None
    """Overrides the timeout of every subscription and tool."""
    failure_policy: Annotated[Text, one_of("", *FAILURE_POLICIES)] = ""
    """Overrides the failure policy: "fail_closed" or "fail_open"."""
    required: Flag | None = None
    """Whether turns wait for it (fail closed until READY); unset: unless fail_open."""
    name: Text = ""
    """How ListPlugins shows it before it first describes itself; empty: its address."""

    def is_required(self) -> bool:
        """Required unless the config says `required: false` or overrides to fail_open."""
        return self.required if self.required is not None else self.failure_policy != "fail_open"


@dataclass(frozen=True, config=SCHEMA)
class Config:
    """The whole server configuration; the only place defaults live."""

    listen: HostPort = DEFAULT_LISTEN
    """host:port to listen on."""
    max_parallel_tool_calls: PositiveInt = MAX_PARALLEL_TOOL_CALLS
    """The default parallel tool-call cap of every agent."""
    shutdown_grace_seconds: NonNegativeSeconds = 5.0
    """How long running RPCs get to finish on SIGTERM."""
    default_provider: Text = DEFAULT_PROVIDER
    """The provider of agents that name none."""
    store: Annotated[Text, one_of("sqlite", "memory", "postgres")] = "sqlite"
    """Where sessions live: "sqlite" (durable, a file under `data_dir`), "postgres" (durable,
    shared by replicas) or "memory"."""
    postgres_dsn: Text = field(default_factory=lambda: os.environ.get("AGENTLOOP_POSTGRES_DSN", ""))
    """The PostgreSQL DSN of `store: postgres` (default: $AGENTLOOP_POSTGRES_DSN)."""
    replica_id: Text = ""
    """With `store: postgres`: this replica's name among the others; empty: host-pid."""
    advertise_address: Text = ""
    """With `store: postgres`: host:port other replicas forward calls to; empty: listen."""
    lease_seconds: LeaseSeconds = 5.0
    """With `store: postgres`: how long a replica owns its agents without renewing: the
    time a failover waits at most, against renewals (a third of it) it must keep up."""
    data_dir: Text = "data"
    """The directory of the SQLite file (`agentloop.db`); relative to the working directory."""
    durability: Annotated[Text, one_of("process", "power")] = "process"
    """What a commit survives: "process" (a crash of the server) or "power" (an OS crash
    or power loss too, at the cost of an fsync per group commit)."""
    agents: tuple[AgentConfig, ...] = ()
    """Agents created at start."""
    subagent_profiles: tuple[SubagentProfile, ...] = ()
    """Profiles `delegate` may name: what a child runs with (`server/settings/profiles.py`)."""
    plugins: tuple[PluginConfig, ...] = ()
    prices: tuple[PriceConfig, ...] = ()
    """What a million tokens cost per provider and model (`server/settings/prices.py`):
    the console shows a session's cost from it."""
    mcp_servers: tuple[McpServerConfig, ...] = ()
    """MCP servers whose tools agents may enable (`mcp:<server>/<tool>`); see the README."""
    """Plugins registered at start."""
    providers: tuple[ProviderConfig, ...] = ()
    """OpenAI-compatible model providers, besides the built-in "scripted"."""
    token_file: Text = ""
    """A file holding the token every client must send (also: $AGENTLOOP_TOKEN)."""
    plugin_token_file: Text = ""
    """A file holding the token sent to plugins (also: $AGENTLOOP_PLUGIN_TOKEN)."""
    tool_order: ToolOrder = None
    """The order tools are offered in: names and one "<unlisted-tools>" marker."""
    plugin_ca_file: Text = ""
    """PEM roots trusted for `tls://` plugin addresses; empty trusts the system's."""
    plugin_timeout_seconds: PositiveSeconds = PLUGIN_TIMEOUT_SECONDS
    """The deadline of a plugin call whose subscription sets none."""
    approval_timeout_seconds: ApprovalTimeout = 300.0
    """How long a tool call waits for approval unless its agent sets its own; 0 turns
    approvals off (an ask is then denied: no approval channel is available)."""
    plugin_allowlist: tuple[AllowPattern, ...] = DEFAULT_ALLOWLIST
    """`host:port` patterns plugin addresses must match (host: name, IP, CIDR or *;
    port: number or *); the default is loopback only."""
    plugin_token_plaintext: Flag = False
    """Send the plugin token to non-loopback plugins without TLS (not recommended)."""
    tls_cert_file: Text = ""
    """PEM certificate chain of the server's own port; with `tls_key_file`, serves TLS."""
    tls_key_file: Text = ""
    """PEM private key of `tls_cert_file`."""
    tls_client_ca_file: Text = ""
    """PEM roots client certificates must chain to (mutual TLS); empty: none asked."""
    event_loop: Annotated[Text, one_of("uvloop", "asyncio")] = "uvloop"
    """The server's event loop: "uvloop" (faster; asyncio's where it is not installed) or
    "asyncio" (Python's own). See `server/edge/event_loop.py`."""
    log_format: Annotated[Text, one_of("text", "json")] = "text"
    """Log lines as "text" (for humans) or "json" (one object per line)."""
    metrics_listen: MetricsListen = ""
    """host:port of the Prometheus endpoint (a bare port: loopback); empty: no metrics."""
    trace_exporter: Annotated[Text, one_of(*TRACE_EXPORTERS)] = ""
    """"otlp", "console" or "none"; empty: $OTEL_TRACES_EXPORTER decides (default none)."""
    otlp_endpoint: Text = ""
    """The OTLP/gRPC collector; empty: $OTEL_EXPORTER_OTLP_ENDPOINT or localhost:4317."""
    limits: Limits = field(default_factory=Limits)
    """Size and count limits; see `server/kernel/limits.py` for each one and its default."""
    retention: Retention = field(default_factory=Retention)
    """How long sessions and request records are kept (default: until deleted)."""
    plugin_max_message_bytes: PositiveInt = MAX_MESSAGE_BYTES
    """The largest message sent to or accepted from a plugin; a larger call fails alone."""
    insecure: Flag = False
    """Allow a non-loopback listen address without TLS and a token (`--insecure`)."""
    output_reserve_tokens: PositiveInt = DEFAULT_OUTPUT_RESERVE
    """Tokens kept free for a model's output: automatic compaction fires before a request
    that would pass window - reserve (at most a quarter of the window is reserved)."""
    keep_recent_tokens: PositiveInt = DEFAULT_KEEP_RECENT
    """Recent history a compaction keeps verbatim, in estimated tokens (at most a
    quarter of the window)."""
    http_listen: HttpListen = ""
    """host:port of the HTTP side: the web console and the API as JSON (a bare port:
    loopback); empty: off. Same TLS and token as `listen`."""
    trusted_proxies: tuple[ProxyAddress, ...] = ()
    """IPs or CIDR blocks of reverse proxies in front of the HTTP side: a request from
    one is logged with the client its `X-Forwarded-For` names; empty: never believed."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        """The checks that span fields: pairs of files, and the names agents use."""
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            fail("set both or neither", "tlsCertFile, tlsKeyFile")
        if self.tls_client_ca_file and not self.tls_cert_file:
            fail("needs tlsCertFile and tlsKeyFile (mutual TLS)", "tlsClientCaFile")
        if self.store == "postgres" and not self.postgres_dsn:
            fail("required with store: postgres (or set $AGENTLOOP_POSTGRES_DSN)", "postgresDsn")
        names = [BUILTIN_PROVIDER]
        for i, provider in enumerate(self.providers):
            if provider.name in names:
                fail(f"{provider.name!r} is already a provider", f"providers[{i}].name")
            names.append(provider.name)
        profiles = [profile.name for profile in self.subagent_profiles]
        for i, name in enumerate(profiles):
            if name in profiles[:i]:
                fail(f"duplicate profile name {name!r}", f"subagentProfiles[{i}].name")
        priced = [(price.provider, price.model) for price in self.prices]
        for i, price in enumerate(self.prices):
            if priced[i] in priced[:i]:
                fail(f"{price.provider}/{price.model} already has a price", f"prices[{i}].model")
        servers = [server.name for server in self.mcp_servers]
        for i, name in enumerate(servers):
            if name in servers[:i]:
                fail(f"duplicate MCP server name {name!r}", f"mcpServers[{i}].name")
        if self.plugins or self.mcp_servers:  # they serve tools known at start only
            return self
        problem = rules.provider_problem(self.default_provider, names)
        if problem:
            fail(problem, "defaultProvider")
        tools = [tool.name for tool in builtin_tools()] + list(DELEGATION_TOOLS)
        seen: set[str] = set()
        for i, agent in enumerate(self.agents):
            if agent.id in seen:
                fail(f"duplicate agent id {agent.id!r}", f"agents[{i}].id")
            seen.add(agent.id)
            if agent.provider and (problem := rules.provider_problem(agent.provider, names)):
                fail(problem, f"agents[{i}].provider")
            if problem := rules.tools_problem(agent.tools, tools, "built-in tool"):
                fail(problem, f"agents[{i}].tools")
        for i, profile in enumerate(self.subagent_profiles):
            where = f"subagentProfiles[{i}]"
            if profile.provider and (problem := rules.provider_problem(profile.provider, names)):
                fail(problem, f"{where}.provider")
            for key, listed in (
                ("tools", profile.tools or ()),
                ("grantTools", profile.grant_tools),
                ("approvalRequiredTools", profile.approval_required_tools or ()),
            ):
                if problem := rules.tools_problem(listed, tools, "built-in tool"):
                    fail(problem, f"{where}.{key}")
        return self


DEFAULT_AGENT = AgentConfig(
    id="assistant", provider="scripted", model="echo", tools=("current_time", "word_count")
)
"""The agent a server without a config file starts with: a scripted tool round trip."""

_SCHEMA = TypeAdapter(Config)


def load_config(path: str | Path | None) -> Config:
    """Read and validate a config file; no path gives the embedded defaults.

    A file that has no `agents` key keeps the demo agent, as no file does (so a file
    that only moves the port still answers the README's first commands); `agents: []`
    starts none.
    """
    if path is None:
        return Config(agents=(DEFAULT_AGENT,))
    import yaml  # only a server given a file reads YAML

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"cannot read config {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"config {path} is not valid YAML: {error}") from error
    config = parse_config(raw if raw is not None else {})
    if raw is None or (isinstance(raw, dict) and "agents" not in raw):
        return replace(config, agents=(DEFAULT_AGENT,))
    return config


def parse_config(raw: object) -> Config:
    """Validate a parsed YAML document (camelCase keys only)."""
    if isinstance(raw, dict):
        for key in CLI_ONLY:
            if key in raw:
                raise ConfigError(f"{key}: unknown field (a command-line flag only)")
    try:
        return _SCHEMA.validate_python(raw, by_alias=True, by_name=False)
    except ValidationError as error:
        raise config_error(error, Config, CLI_ONLY) from None


def override(config: Config, **changes: Any) -> Config:
    """`config` with some fields changed (command-line flags), validated like the file."""
    try:
        return replace(config, **changes)
    except ValidationError as error:
        raise config_error(error, Config, CLI_ONLY) from None


def read_token(path: str, variable: str) -> str:
    """A token from a file (stripped), else from the environment; empty when neither."""
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as error:
            raise ConfigError(f"cannot read token file {path}: {error.strerror}") from error
        if not token:
            raise ConfigError(f"token file {path} is empty")
        return token
    return os.environ.get(variable, "").strip()


def read_pem(path: str) -> bytes | None:
    """The bytes of a PEM file; None for an empty path."""
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from error


def metrics_address(value: str) -> str:
    """`host:port` of the metrics endpoint; a bare port (or `:port`) stays on loopback."""
    if not value:
        return ""
    host, _, port = value.rpartition(":")
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"metricsListen: {value!r} must be host:port or a port")
    return f"{host or '127.0.0.1'}:{port}"


def http_address(value: object) -> str:
    """`host:port` of the HTTP side (`httpListen`); a bare port (or `:port`) is loopback."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ConfigError("httpListen: must be a string or a port number")
    text = value
    if not text:
        return ""
    host, _, port = text.rpartition(":")
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"httpListen: {text!r} must be host:port or a port")
    return f"{host or '127.0.0.1'}:{port}"
