"""Server configuration: a YAML file, validated at start with errors that name the field."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import yaml

from server.addresses import DEFAULT_ALLOWLIST, parse_pattern
from server.builtin_tools import builtin_tools
from server.errors import CodedError
from server.factory import ID_PATTERN
from server.limits import LIMIT_FIELDS, Limits
from server.models.openai_wire import MAX_TOKENS_FIELDS
from server.system_prompt import PERSONA_VARIABLES, interpolate
from server.tools import UNLISTED_TOOLS

DEFAULT_LISTEN = "127.0.0.1:50051"

SERVER_FIELDS = {
    "listen", "maxParallelToolCalls", "shutdownGraceSeconds", "defaultProvider", "store",
    "dataDir", "agents", "plugins", "tokenFile", "pluginTokenFile", "providers",
    "pluginTimeoutSeconds", "pluginCaFile", "toolOrder", "durability", "pluginMaxMessageBytes",
    "postgresDsn", "replicaId", "advertiseAddress", "leaseSeconds",
    "approvalTimeoutSeconds",
}  # fmt: skip
TLS_FIELDS = ("tlsCertFile", "tlsKeyFile", "tlsClientCaFile")
GUARD_FIELDS = {"limits", "pluginAllowlist", "pluginTokenPlaintext", *TLS_FIELDS}
"""The fields of limits and transport security."""
OBSERVE_FIELDS = {"logFormat", "metricsListen", "traceExporter", "otlpEndpoint"}
"""The fields of logs, metrics and traces."""
CONSOLE_FIELDS = {"httpListen"}
"""The fields of the HTTP side (the web console and the API as JSON)."""
TRACE_EXPORTERS = ("", "none", "otlp", "console")
PROVIDER_FIELDS = {
    "name", "type", "baseUrl", "apiKeyEnv", "defaultModel", "headers", "connectTimeoutSeconds",
    "readTimeoutSeconds", "maxAttempts", "initialBackoffSeconds", "maxBackoffSeconds",
    "maxRetryAfterSeconds", "maxTokensField",
}  # fmt: skip
PLUGIN_FIELDS = {"address", "order", "timeoutSeconds", "failurePolicy", "required", "name"}
FAILURE_POLICIES = ("fail_closed", "fail_open")
BUILTIN_PROVIDER = "scripted"
AGENT_FIELDS = {
    "id", "provider", "model", "cwd", "tools", "persona", "maxParallelToolCalls",
    "resumeSessionId",
}  # fmt: skip


class ConfigError(ValueError):
    """The configuration is invalid; the message names the field."""


@dataclass(frozen=True)
class AgentConfig:
    """An agent created at start, on a fresh session `<id>-session-<uuid>`."""

    id: str
    """The agent id."""
    provider: str = ""
    """The model provider; empty means the server default."""
    model: str = ""
    """The model name."""
    cwd: str = ""
    """The absolute working directory written into the session header."""
    tools: tuple[str, ...] = ()
    """The built-in tools the agent may use."""
    persona: str = ""
    """The persona section of the system prompt."""
    max_parallel_tool_calls: int | None = None
    """The agent's parallel tool-call cap; None means the server's."""
    resume_session_id: str = ""
    """Resume this stored session instead of creating one (cwd is then ignored)."""


@dataclass(frozen=True)
class ProviderConfig:
    """An OpenAI-compatible model provider (the API key comes from the environment)."""

    name: str
    """The name agents select with `provider`."""
    base_url: str
    """The API root; requests go to `<base_url>/chat/completions`."""
    api_key_env: str = ""
    """The environment variable holding the API key; empty: no key is sent."""
    default_model: str = ""
    """The model of agents that name none."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra request headers."""
    connect_timeout_seconds: float = 10.0
    """TCP connect and TLS handshake."""
    read_timeout_seconds: float = 300.0
    """The longest silence tolerated mid-request."""
    max_attempts: int = 3
    """Attempts per request before the first chunk (1: never retry)."""
    initial_backoff_seconds: float = 0.5
    """The first retry delay, doubled per retry."""
    max_backoff_seconds: float = 8.0
    """The longest retry delay."""
    max_retry_after_seconds: float = 60.0
    """The cap on a server's Retry-After."""
    max_tokens_field: str = "auto"
    """How the output cap is sent: "max_tokens", "max_completion_tokens" (OpenAI's
    reasoning models need it), or "auto" (by model name)."""


@dataclass(frozen=True)
class PluginConfig:
    """A plugin registered at start (and retried until it answers)."""

    address: str
    """host:port, or tls://host:port."""
    order: int | None = None
    """Overrides the order of every subscription."""
    timeout_seconds: float | None = None
    """Overrides the timeout of every subscription and tool."""
    failure_policy: str = ""
    """Overrides the failure policy: "fail_closed" or "fail_open"."""
    required: bool | None = None
    """Whether turns wait for it (fail closed until READY); unset: unless fail_open."""
    name: str = ""
    """How ListPlugins shows it before it first describes itself; empty: its address."""

    def is_required(self) -> bool:
        """Required unless the config says `required: false` or overrides to fail_open."""
        return self.required if self.required is not None else self.failure_policy != "fail_open"


@dataclass(frozen=True)
class Config:
    """The whole server configuration; the only place defaults live."""

    listen: str = DEFAULT_LISTEN
    """host:port to listen on."""
    max_parallel_tool_calls: int = 10
    """The default parallel tool-call cap of every agent."""
    shutdown_grace_seconds: float = 5.0
    """How long running RPCs get to finish on SIGTERM."""
    default_provider: str = "scripted"
    """The provider of agents that name none."""
    store: str = "sqlite"
    """Where sessions live: "sqlite" (durable, a file under `data_dir`), "postgres" (durable,
    shared by replicas) or "memory"."""
    postgres_dsn: str = ""
    """The PostgreSQL DSN of `store: postgres` (also: $AGENTLOOP_POSTGRES_DSN)."""
    replica_id: str = ""
    """With `store: postgres`: this replica's name among the others; empty: host-pid."""
    advertise_address: str = ""
    """With `store: postgres`: host:port other replicas forward calls to; empty: listen."""
    lease_seconds: float = 5.0
    """With `store: postgres`: how long a replica owns its agents without renewing: the
    time a failover waits at most, against renewals (a third of it) it must keep up."""
    data_dir: str = "data"
    """The directory of the SQLite file (`agentloop.db`); relative to the working directory."""
    durability: str = "process"
    """What a commit survives: "process" (a crash of the server) or "power" (an OS crash
    or power loss too, at the cost of an fsync per group commit)."""
    agents: tuple[AgentConfig, ...] = field(default_factory=tuple)
    """Agents created at start."""
    plugins: tuple[PluginConfig, ...] = field(default_factory=tuple)
    """Plugins registered at start."""
    providers: tuple[ProviderConfig, ...] = field(default_factory=tuple)
    """OpenAI-compatible model providers, besides the built-in "scripted"."""
    token_file: str = ""
    """A file holding the token every client must send (also: $AGENTLOOP_TOKEN)."""
    plugin_token_file: str = ""
    """A file holding the token sent to plugins (also: $AGENTLOOP_PLUGIN_TOKEN)."""
    tool_order: tuple[str, ...] | None = None
    """The order tools are offered in: names and one "<unlisted-tools>" marker."""
    plugin_ca_file: str = ""
    """PEM roots trusted for `tls://` plugin addresses; empty trusts the system's."""
    plugin_timeout_seconds: float = 5.0
    """The deadline of a plugin call whose subscription sets none."""
    approval_timeout_seconds: float = 300.0
    """How long a tool call waits for approval unless its agent sets its own; 0 turns
    approvals off (an ask is then denied: no approval channel is available)."""
    plugin_allowlist: tuple[str, ...] = DEFAULT_ALLOWLIST
    """`host:port` patterns plugin addresses must match (host: name, IP, CIDR or *;
    port: number or *); the default is loopback only."""
    plugin_token_plaintext: bool = False
    """Send the plugin token to non-loopback plugins without TLS (not recommended)."""
    tls_cert_file: str = ""
    """PEM certificate chain of the server's own port; with `tls_key_file`, serves TLS."""
    tls_key_file: str = ""
    """PEM private key of `tls_cert_file`."""
    tls_client_ca_file: str = ""
    """PEM roots client certificates must chain to (mutual TLS); empty: none asked."""
    log_format: str = "text"
    """Log lines as "text" (for humans) or "json" (one object per line)."""
    metrics_listen: str = ""
    """host:port of the Prometheus endpoint (a bare port: loopback); empty: no metrics."""
    trace_exporter: str = ""
    """"otlp", "console" or "none"; empty: $OTEL_TRACES_EXPORTER decides (default none)."""
    otlp_endpoint: str = ""
    """The OTLP/gRPC collector; empty: $OTEL_EXPORTER_OTLP_ENDPOINT or localhost:4317."""
    limits: Limits = field(default_factory=Limits)
    """Size and count limits; see `server/limits.py` for each one and its default."""
    plugin_max_message_bytes: int = 16 * 1024 * 1024
    """The largest message sent to or accepted from a plugin; a larger call fails alone."""
    insecure: bool = False
    """Allow a non-loopback listen address without TLS and a token (`--insecure`)."""
    http_listen: str = ""
    """host:port of the HTTP side: the web console and the API as JSON (a bare port:
    loopback); empty: off. Same TLS and token as `listen`."""


DEFAULT_AGENT = AgentConfig(
    id="assistant", provider="scripted", model="echo", tools=("current_time", "word_count")
)
"""The agent a server without a config file starts with: a scripted tool round trip."""


def load_config(path: str | Path | None) -> Config:
    """Read and validate a config file; no path gives the embedded defaults."""
    if path is None:
        return Config(agents=(DEFAULT_AGENT,))
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"cannot read config {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"config {path} is not valid YAML: {error}") from error
    return parse_config(raw if raw is not None else {})


def parse_config(raw: object) -> Config:
    """Validate a parsed YAML document."""
    doc = _mapping(raw, "config")
    _no_unknown(doc, "", SERVER_FIELDS | GUARD_FIELDS | OBSERVE_FIELDS | CONSOLE_FIELDS)
    listen = _string(doc.get("listen", DEFAULT_LISTEN), "listen")
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"listen: {listen!r} must be host:port")
    plugins_raw = doc.get("plugins", [])
    if not isinstance(plugins_raw, list):
        raise ConfigError("plugins: must be a list")
    plugins = tuple(_plugin(item, f"plugins[{i}]") for i, item in enumerate(plugins_raw))
    providers_raw = doc.get("providers", [])
    if not isinstance(providers_raw, list):
        raise ConfigError("providers: must be a list")
    providers = tuple(_provider(item, f"providers[{i}]") for i, item in enumerate(providers_raw))
    names = [BUILTIN_PROVIDER]
    for i, provider in enumerate(providers):
        if provider.name in names:
            raise ConfigError(f"providers[{i}].name: {provider.name!r} is already a provider")
        names.append(provider.name)
    default_provider = _string(doc.get("defaultProvider", BUILTIN_PROVIDER), "defaultProvider")
    # With plugins listed, a provider may be one that a plugin serves: known only at start.
    checked = None if plugins else names
    if checked is not None and default_provider not in checked:
        raise ConfigError(
            f"defaultProvider: {default_provider!r} is not a provider (known: {', '.join(names)})"
        )
    agents_raw = doc.get("agents", [])
    if not isinstance(agents_raw, list):
        raise ConfigError("agents: must be a list")
    agents = tuple(_agent(item, f"agents[{i}]", checked) for i, item in enumerate(agents_raw))
    ids = [a.id for a in agents]
    for i, agent_id in enumerate(ids):
        if agent_id in ids[:i]:
            raise ConfigError(f"agents[{i}].id: duplicate agent id {agent_id!r}")
    grace = doc.get("shutdownGraceSeconds", 5.0)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
        raise ConfigError("shutdownGraceSeconds: must be a non-negative number")
    plugin_timeout = doc.get("pluginTimeoutSeconds", 5.0)
    if (
        isinstance(plugin_timeout, bool)
        or not isinstance(plugin_timeout, int | float)
        or plugin_timeout <= 0
    ):
        raise ConfigError("pluginTimeoutSeconds: must be a positive number")
    store = _string(doc.get("store", "sqlite"), "store")
    if store not in ("sqlite", "memory", "postgres"):
        raise ConfigError(f"store: {store!r} must be sqlite, memory or postgres")
    postgres_dsn = _string(
        doc.get("postgresDsn", os.environ.get("AGENTLOOP_POSTGRES_DSN", "")), "postgresDsn"
    )
    if store == "postgres" and not postgres_dsn:
        raise ConfigError(
            "postgresDsn: required with store: postgres (or set $AGENTLOOP_POSTGRES_DSN)"
        )
    durability = _string(doc.get("durability", "process"), "durability")
    if durability not in ("process", "power"):
        raise ConfigError(f"durability: {durability!r} must be process or power")
    lease = doc.get("leaseSeconds", 5.0)
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not 1 <= lease <= 300:
        raise ConfigError("leaseSeconds: must be a number of seconds from 1 to 300")
    return Config(
        listen=listen,
        store=store,
        postgres_dsn=postgres_dsn,
        replica_id=_string(doc.get("replicaId", ""), "replicaId"),
        advertise_address=_string(doc.get("advertiseAddress", ""), "advertiseAddress"),
        lease_seconds=float(lease),
        durability=durability,
        data_dir=_string(doc.get("dataDir", "data"), "dataDir"),
        plugins=plugins,
        providers=providers,
        token_file=_string(doc.get("tokenFile", ""), "tokenFile"),
        plugin_token_file=_string(doc.get("pluginTokenFile", ""), "pluginTokenFile"),
        max_parallel_tool_calls=_positive(
            doc.get("maxParallelToolCalls", 10), "maxParallelToolCalls"
        ),
        shutdown_grace_seconds=float(grace),
        plugin_timeout_seconds=float(plugin_timeout),
        approval_timeout_seconds=_approval_timeout(doc.get("approvalTimeoutSeconds", 300.0)),
        plugin_ca_file=_string(doc.get("pluginCaFile", ""), "pluginCaFile"),
        tool_order=_tool_order(doc.get("toolOrder")),
        limits=_limits(doc.get("limits", {})),
        **_tls(doc),
        **_observability(doc),
        plugin_allowlist=_allowlist(doc.get("pluginAllowlist", list(DEFAULT_ALLOWLIST))),
        plugin_token_plaintext=_boolean(
            doc.get("pluginTokenPlaintext", False), "pluginTokenPlaintext"
        ),
        plugin_max_message_bytes=_positive(
            doc.get("pluginMaxMessageBytes", 16 * 1024 * 1024), "pluginMaxMessageBytes"
        ),
        default_provider=default_provider,
        agents=agents,
        http_listen=http_address(doc.get("httpListen", "")),
    )


def _agent(raw: object, where: str, providers: list[str] | None) -> AgentConfig:
    item = _mapping(raw, where)
    _no_unknown(item, where, AGENT_FIELDS)
    if "id" not in item:
        raise ConfigError(f"{where}.id: is required")
    agent_id = _string(item["id"], f"{where}.id")
    if not ID_PATTERN.fullmatch(agent_id):
        raise ConfigError(
            f"{where}.id: {agent_id!r} must be 1-128 letters, digits, '.', '_', ':' or '-'"
        )
    provider = _string(item.get("provider", ""), f"{where}.provider")
    if provider and providers is not None and provider not in providers:
        raise ConfigError(
            f"{where}.provider: {provider!r} is not a provider (known: {', '.join(providers)})"
        )
    cwd = _string(item.get("cwd", ""), f"{where}.cwd")
    if cwd and not cwd.startswith("/"):
        raise ConfigError(f"{where}.cwd: {cwd!r} must be an absolute path")
    tools = item.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise ConfigError(f"{where}.tools: must be a list of tool names")
    known_tools = sorted(tool.name for tool in builtin_tools())
    for tool in tools:
        if tool not in known_tools:
            raise ConfigError(
                f"{where}.tools: {tool!r} is not a built-in tool (known: {', '.join(known_tools)})"
            )
    persona = _string(item.get("persona", ""), f"{where}.persona")
    try:
        # A resumed agent's cwd comes from its stored session: checked when it starts.
        values: dict[str, str | None] = dict.fromkeys(PERSONA_VARIABLES, "x")
        if not cwd and "resumeSessionId" not in item:
            values["cwd"] = None
        interpolate(persona, values)
    except CodedError as error:
        raise ConfigError(
            f"{where}.persona: {error} (known: {', '.join(PERSONA_VARIABLES)})"
        ) from None
    cap = item.get("maxParallelToolCalls")
    return AgentConfig(
        id=agent_id,
        provider=provider,
        model=_string(item.get("model", ""), f"{where}.model"),
        cwd=cwd,
        tools=tuple(tools),
        persona=persona,
        max_parallel_tool_calls=None
        if cap is None
        else _positive(cap, f"{where}.maxParallelToolCalls"),
        resume_session_id=_string(item.get("resumeSessionId", ""), f"{where}.resumeSessionId"),
    )


class _TlsFiles(TypedDict):
    tls_cert_file: str
    tls_key_file: str
    tls_client_ca_file: str


def _tls(doc: dict[str, Any]) -> _TlsFiles:
    """The TLS files, checked to come in pairs, as `Config` keyword arguments."""
    tls = {key: _string(doc.get(key, ""), key) for key in TLS_FIELDS}
    if bool(tls["tlsCertFile"]) != bool(tls["tlsKeyFile"]):
        raise ConfigError("tlsCertFile, tlsKeyFile: set both or neither")
    if tls["tlsClientCaFile"] and not tls["tlsCertFile"]:
        raise ConfigError("tlsClientCaFile: needs tlsCertFile and tlsKeyFile (mutual TLS)")
    return _TlsFiles(
        tls_cert_file=tls["tlsCertFile"],
        tls_key_file=tls["tlsKeyFile"],
        tls_client_ca_file=tls["tlsClientCaFile"],
    )


def _allowlist(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(entry, str) for entry in raw):
        raise ConfigError("pluginAllowlist: must be a list of host:port patterns")
    for i, entry in enumerate(raw):
        try:
            parse_pattern(entry)
        except ValueError as error:
            raise ConfigError(f"pluginAllowlist[{i}]: {error}") from None
    return tuple(raw)


def _boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false")
    return value


def _limits(raw: object) -> Limits:
    item = _mapping(raw, "limits")
    _no_unknown(item, "limits", set(LIMIT_FIELDS))
    values = {LIMIT_FIELDS[key]: _positive(value, f"limits.{key}") for key, value in item.items()}
    return Limits(**values)


def _provider(raw: object, where: str) -> ProviderConfig:
    item = _mapping(raw, where)
    _no_unknown(item, where, PROVIDER_FIELDS)
    for key in ("name", "baseUrl"):
        if key not in item:
            raise ConfigError(f"{where}.{key}: is required")
    kind = _string(item.get("type", "openai"), f"{where}.type")
    if kind != "openai":
        raise ConfigError(f"{where}.type: {kind!r} is not a provider type (known: openai)")
    base_url = _string(item["baseUrl"], f"{where}.baseUrl")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}.baseUrl: {base_url!r} must start with http:// or https://")
    headers = _mapping(item.get("headers", {}), f"{where}.headers")
    for key, value in headers.items():
        _string(value, f"{where}.headers.{key}")

    def seconds(key: str, default: float) -> float:
        value = item.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{where}.{key}: must be a positive number")
        return float(value)

    return ProviderConfig(
        name=_string(item["name"], f"{where}.name"),
        base_url=base_url,
        api_key_env=_string(item.get("apiKeyEnv", ""), f"{where}.apiKeyEnv"),
        default_model=_string(item.get("defaultModel", ""), f"{where}.defaultModel"),
        headers=tuple(sorted(headers.items())),
        connect_timeout_seconds=seconds("connectTimeoutSeconds", 10.0),
        read_timeout_seconds=seconds("readTimeoutSeconds", 300.0),
        max_attempts=_positive(item.get("maxAttempts", 3), f"{where}.maxAttempts"),
        initial_backoff_seconds=seconds("initialBackoffSeconds", 0.5),
        max_backoff_seconds=seconds("maxBackoffSeconds", 8.0),
        max_retry_after_seconds=seconds("maxRetryAfterSeconds", 60.0),
        max_tokens_field=_max_tokens_field(item.get("maxTokensField", "auto"), where),
    )


def _max_tokens_field(raw: object, where: str) -> str:
    value = _string(raw, f"{where}.maxTokensField")
    if value not in MAX_TOKENS_FIELDS:
        raise ConfigError(f"{where}.maxTokensField: must be one of {', '.join(MAX_TOKENS_FIELDS)}")
    return value


def _plugin(raw: object, where: str) -> PluginConfig:
    item = _mapping(raw, where)
    _no_unknown(item, where, PLUGIN_FIELDS)
    if "address" not in item:
        raise ConfigError(f"{where}.address: is required")
    order = item.get("order")
    if order is not None and (isinstance(order, bool) or not isinstance(order, int)):
        raise ConfigError(f"{where}.order: must be an integer")
    timeout = item.get("timeoutSeconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise ConfigError(f"{where}.timeoutSeconds: must be a positive number")
    policy = _string(item.get("failurePolicy", ""), f"{where}.failurePolicy")
    if policy and policy not in FAILURE_POLICIES:
        raise ConfigError(f"{where}.failurePolicy: {policy!r} must be fail_closed or fail_open")
    required = item.get("required")
    if required is not None and not isinstance(required, bool):
        raise ConfigError(f"{where}.required: must be true or false")
    return PluginConfig(
        address=_string(item["address"], f"{where}.address"),
        order=order,
        timeout_seconds=None if timeout is None else float(timeout),
        failure_policy=policy,
        required=required,
        name=_string(item.get("name", ""), f"{where}.name"),
    )


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


def _tool_order(raw: object) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(n, str) and n for n in raw):
        raise ConfigError("toolOrder: must be a list of tool names")
    if raw.count(UNLISTED_TOOLS) != 1:
        raise ConfigError(f'toolOrder: must contain "{UNLISTED_TOOLS}" exactly once')
    if len(set(raw)) != len(raw):
        raise ConfigError("toolOrder: names a tool twice")
    return tuple(raw)


def read_pem(path: str) -> bytes | None:
    """The bytes of a PEM file; None for an empty path."""
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from error


def _mapping(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping")
    return raw


def _no_unknown(doc: dict[str, Any], where: str, known: set[str]) -> None:
    for key in doc:
        if key not in known:
            prefix = f"{where}." if where else ""
            raise ConfigError(f"{prefix}{key}: unknown field (known: {', '.join(sorted(known))})")


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: must be a string")
    return value


def _positive(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: must be a positive integer, not {value!r}")
    return value


def _observability(doc: dict[str, Any]) -> dict[str, Any]:
    log_format = _string(doc.get("logFormat", "text"), "logFormat")
    if log_format not in ("text", "json"):
        raise ConfigError(f"logFormat: {log_format!r} must be text or json")
    metrics = doc.get("metricsListen", "")
    if isinstance(metrics, int) and not isinstance(metrics, bool):
        metrics = str(metrics)
    metrics = metrics_address(_string(metrics, "metricsListen"))
    exporter = _string(doc.get("traceExporter", ""), "traceExporter")
    if exporter not in TRACE_EXPORTERS:
        raise ConfigError(f"traceExporter: {exporter!r} must be otlp, console or none")
    return {
        "log_format": log_format,
        "metrics_listen": metrics,
        "trace_exporter": exporter,
        "otlp_endpoint": _string(doc.get("otlpEndpoint", ""), "otlpEndpoint"),
    }


def metrics_address(value: str) -> str:
    """`host:port` of the metrics endpoint; a bare port (or `:port`) stays on loopback."""
    if not value:
        return ""
    host, _, port = value.rpartition(":")
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"metricsListen: {value!r} must be host:port or a port")
    return f"{host or '127.0.0.1'}:{port}"


def _approval_timeout(value: object) -> float:
    """`approvalTimeoutSeconds`: 0 (approvals off) up to 24 hours."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 86400:
        raise ConfigError("approvalTimeoutSeconds: must be a number from 0 to 86400")
    return float(value)


def http_address(value: object) -> str:
    """`host:port` of the HTTP side (`httpListen`); a bare port (or `:port`) is loopback."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _string(value, "httpListen")
    if not text:
        return ""
    host, _, port = text.rpartition(":")
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"httpListen: {text!r} must be host:port or a port")
    return f"{host or '127.0.0.1'}:{port}"
