"""The gRPC server: services, health, reflection, config agents, graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import TYPE_CHECKING, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import plugin_registry_service_pb2, plugin_registry_service_pb2_grpc
from agentloop.v1 import (
    agent_factory_service_pb2,
    agent_factory_service_pb2_grpc,
    agent_pb2,
    agent_service_pb2,
)
from server.edge.api_access import AccessLog
from server.edge.api_agent import AgentServicer
from server.edge.api_edge import Edge
from server.edge.api_factory import AgentFactoryServicer
from server.edge.api_guard import RequestGuard
from server.edge.api_plugins import PluginRegistryServicer
from server.edge.api_reflection import Reflection
from server.edge.api_stream_wire import add_agent_service
from server.edge.auth import TokenAuth
from server.edge.grpc_bounds import grpc_options
from server.edge.method_table import MethodTable
from server.edge.price_table import price_messages
from server.kernel.errors import SessionDamaged
from server.kernel.tasks import TaskGroup
from server.lifecycle.delegation import delegation_tools
from server.lifecycle.factory import AgentFactory
from server.lifecycle.retention import Sweeper, watch_retention
from server.lifecycle.runtime import build_runtime
from server.loop.runtime import Runtime
from server.mcp.sources import McpSources
from server.observability.logs import fields
from server.observability.telemetry import Telemetry
from server.plugins.listeners import SEAM_NAMES
from server.plugins.registry import Overrides, PluginRegistry
from server.plugins.required import READINESS_SERVICE
from server.settings.addresses import Allowlist, is_loopback
from server.settings.config import Config, ConfigError, read_pem, read_token

if TYPE_CHECKING:
    from collections.abc import Mapping

    from server.edge.api_http import HttpSide
    from server.edge.app_replica import Replica
    from server.stores.postgres import PostgresStore

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    agent_factory_service_pb2.DESCRIPTOR.services_by_name["AgentFactoryService"].full_name,
    agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
    plugin_registry_service_pb2.DESCRIPTOR.services_by_name["PluginRegistryService"].full_name,
)

CANCEL_SETTLE_SECONDS = 1.0
"""How long the teardown of agents cancelled past the grace period may still take."""

FAILURE_POLICIES = {
    "": hk.FAILURE_POLICY_UNSPECIFIED,
    "fail_closed": hk.FAILURE_POLICY_FAIL_CLOSED,
    "fail_open": hk.FAILURE_POLICY_FAIL_OPEN,
}


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    """TLS credentials of the server's port (mutual with a client CA); None for plaintext."""
    if not config.tls_cert_file:
        return None
    key, chain = read_pem(config.tls_key_file), read_pem(config.tls_cert_file)
    assert key is not None and chain is not None  # both set: the config checked it
    client_ca = read_pem(config.tls_client_ca_file)
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def peer_credentials(config: Config) -> grpc.ChannelCredentials | None:
    """TLS for calls to the other replicas, which serve like this one.

    Their certificates are checked against `tlsClientCaFile` (the cluster's CA) or the
    system's roots; with mutual TLS this server presents its own certificate, which
    then needs the clientAuth usage too.
    """
    if not config.tls_cert_file:
        return None
    client_ca = read_pem(config.tls_client_ca_file)
    if client_ca is None:
        return grpc.ssl_channel_credentials()
    return grpc.ssl_channel_credentials(
        root_certificates=client_ca,
        private_key=read_pem(config.tls_key_file),
        certificate_chain=read_pem(config.tls_cert_file),
    )


def check_exposed(config: Config, tls: bool, token: bool, field: str = "listen") -> None:
    """A port other machines reach needs TLS, and a token or client certificates."""
    missing = []
    if not tls:
        missing.append("TLS (tlsCertFile and tlsKeyFile)")
    if not token and not config.tls_client_ca_file:
        missing.append("a token (tokenFile or $AGENTLOOP_TOKEN) or tlsClientCaFile")
    if missing:
        raise ConfigError(
            f"{field}: {config.http_listen if field == 'httpListen' else config.listen} is"
            f" reachable from other machines; set"
            f" {' and '.join(missing)}, or start with --insecure"
        )


class App:
    """One running server."""

    def __init__(
        self, config: Config, runtime: Runtime | None = None, telemetry: Telemetry | None = None
    ) -> None:
        """Build the server; raises `ConfigError` for an unreadable token or an unsafe listen."""
        self.config = config
        token = read_token(config.token_file, "AGENTLOOP_TOKEN")
        self.credentials = server_credentials(config)
        if not config.insecure and not is_loopback(config.listen):
            check_exposed(config, self.credentials is not None, bool(token))
        if config.http_listen and not config.insecure and not is_loopback(config.http_listen):
            check_exposed(config, self.credentials is not None, bool(token), "httpListen")
        self.runtime = runtime or build_runtime(config)
        self.factory = AgentFactory(self.runtime)
        # They create children: factory-bound, with the config's sub-agent profiles.
        for tool in delegation_tools(self.factory, config.subagent_profiles):
            self.runtime.tools.register(tool)
        self.plugins = PluginRegistry(
            self.runtime,
            self._session_of,
            read_token(config.plugin_token_file, "AGENTLOOP_PLUGIN_TOKEN"),
            read_pem(config.plugin_ca_file),
            allowlist=Allowlist.of(config.plugin_allowlist),
            token_plaintext=config.plugin_token_plaintext,
            max_message_bytes=config.plugin_max_message_bytes,
            labels_of=self._labels_of,
        )
        self.health = health.aio.HealthServicer()
        limits = self.runtime.limits
        self.guard = RequestGuard(limits)
        self.telemetry = telemetry or Telemetry(config)
        self.telemetry.install(
            self.runtime.seams,
            agents=lambda: len(self.factory.agents),
            streams=lambda: self.guard.streams,
            queued=lambda: sum(
                len(a.inbox.queued) + len(a.inbox.steering) for a in self.factory.agents.values()
            ),
            plugins=lambda: {name: p.stats for name, p in self.plugins.plugins.items()},
            seam_names=SEAM_NAMES,
        )
        # The access log sees every call; then auth, so that an unauthenticated caller
        # learns nothing, not even that a body is bad.
        access = AccessLog(self.telemetry.metrics, self.telemetry.tracing)
        auth = TokenAuth(token) if token else None
        edge = Edge(access, self.guard, auth)
        interceptors: list[grpc.aio.ServerInterceptor] = []
        self.plugin_servicer = PluginRegistryServicer(self.plugins)
        self.factory_servicer = AgentFactoryServicer(self.factory)
        self.replica: Replica | None = None
        self.sweeper: Sweeper | None = None
        """Removes what the retention policy no longer keeps (when it has a rule)."""
        if config.store == "postgres":  # replicas: calls go to owners
            from server.edge.app_replica import Replica  # only a replica loads its parts

            self.replica = Replica(
                config,
                cast("PostgresStore", self.runtime.store),
                self.factory,
                self.plugins,
                self.plugin_servicer,
                token,
                peer_credentials(config),
            )
            self.factory_servicer.elsewhere = self.replica.other_agents
            self.factory_servicer.drain = self.replica.drain
            # The edge sees every call before the forwarder hands it to its owner.
            interceptors += [edge, self.replica.forwarder]
        self.server = grpc.aio.server(
            interceptors=interceptors,
            options=grpc_options(limits),
        )
        # The services register in one table, served as one generic handler (see
        # method_table: what grpc.aio costs per call grows with registered methods).
        methods = MethodTable()
        if not interceptors:  # the edge wraps each call's handler as the table finds it
            methods.edge = edge.handler
        registrar = cast("grpc.aio.Server", methods)  # has what the generated code calls
        plugin_registry_service_pb2_grpc.add_PluginRegistryServiceServicer_to_server(
            self.plugin_servicer, registrar
        )
        agent_factory_service_pb2_grpc.add_AgentFactoryServiceServicer_to_server(
            self.factory_servicer, registrar
        )
        prices = price_messages(config.prices)
        servicer = AgentServicer(self.factory, prices)
        add_agent_service(servicer, methods)  # the stream writes bytes
        health_pb2_grpc.add_HealthServicer_to_server(self.health, registrar)
        Reflection((*SERVICE_NAMES, health.SERVICE_NAME)).add_to(registrar)
        methods.install(self.server)
        self.http: HttpSide | None = None
        if config.http_listen:  # the console: JSON over HTTP, forwarded to this server
            from server.edge.api_http import HttpSide, tls_context  # aiohttp: only then

            self.http = HttpSide(
                config.http_listen,
                tls_context(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file),
                limits,
                local_hosts_only=not token and is_loopback(config.http_listen),
                trusted_proxies=config.trusted_proxies,
            )
            access.relay_key = self.http.relay_key
        self.mcp = McpSources(config.mcp_servers, self.runtime.tools)
        self.plugin_servicer.tool_sources = self.mcp.describe
        self.port = 0
        self._stopping: asyncio.Task[None] | None = None
        self._health_updates = TaskGroup("health")
        """Readiness updates on their way to the health service; closed at stop."""

    async def start(self) -> int:
        """Bind, start serving, create the config agents; returns the bound port."""
        try:
            await self.runtime.store.open()
        except SessionDamaged as error:  # reported per session later; the server serves
            log.error("%s", error)
        await self.telemetry.start()  # before gRPC: a taken metrics port stops the start
        if self.credentials is not None:
            self.port = self.server.add_secure_port(self.config.listen, self.credentials)
        else:
            self.port = self.server.add_insecure_port(self.config.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.config.listen}")
        if self.http is not None:  # before serving: a taken HTTP port stops the start
            self.server.add_insecure_port(self.http.grpc_address())
            http_port = await self.http.start()
            host = self.config.http_listen.rpartition(":")[0]
            log.info("console on http%s://%s:%d/", "s" * bool(self.credentials), host, http_port)
        await self._readiness(self.plugins.ready())
        self.plugins.on_readiness = self._on_readiness
        if self.replica is not None:  # readiness follows the database
            self.replica.store.health.on_change = lambda _: self._on_readiness(self.plugins.ready())
        await self.server.start()
        if self.replica is not None:
            await self.replica.join(self.port)
        for plugin in self.config.plugins:
            overrides = Overrides(
                order=plugin.order,
                timeout=plugin.timeout_seconds,
                failure_policy=FAILURE_POLICIES[plugin.failure_policy],
            )
            await self.plugins.add_config_plugin(
                plugin.address, overrides, required=plugin.is_required(), name=plugin.name
            )
        await self.mcp.start()  # before the config agents: their tools may be MCP tools
        for agent in self.config.agents:
            options = agent_pb2.AgentOptions(
                provider=agent.provider, model=agent.model, tools=agent.tools,
                persona=agent.persona, labels=dict(agent.labels),
            )  # fmt: skip
            if agent.max_parallel_tool_calls is not None:
                options.max_parallel_tool_calls = agent.max_parallel_tool_calls
            try:
                if agent.resume_session_id:
                    created = await self.factory.resume(agent.id, agent.resume_session_id, options)
                else:
                    created = await self.factory.create(
                        agent.id, options, cwd=agent.cwd, adopt_pending=True
                    )
                log.info(
                    "agent %s started on session %s", agent.id, created.session.session_id,
                    extra=fields(agent=agent.id, session=created.session.session_id),
                )  # fmt: skip
            except Exception as error:  # reported, not fatal: the server still serves
                log.error("config agent %s was not started: %s", agent.id, error)
        if self.replica is not None:
            self.replica.run()
        if self.config.retention.on():
            self.sweeper = Sweeper(self.factory, self.config.retention)
            self.sweeper.start()
            if self.telemetry.metrics is not None:
                watch_retention(self.telemetry.metrics, self.sweeper)
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    async def _readiness(self, ready: bool) -> None:
        ready = ready and self._store_reachable()
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set(READINESS_SERVICE, serving if ready else not_serving)

    def _on_readiness(self, ready: bool) -> None:
        """Readiness may have changed (a required plugin came or went): tell health."""
        self._health_updates.start(self._readiness(ready))

    def _store_reachable(self) -> bool:
        """False while a shared store is unreachable (it reconnects meanwhile)."""
        health = getattr(self.runtime.store, "health", None)
        return health is None or bool(health.reachable)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, dispose agents (turns end `disposed`), stop.

        The agents get `grace` seconds (default: the config's) to end their turns (a
        replica first hands each agent over between turns, within half of it); the
        drivers still running then are cancelled. Then the RPCs get `grace` seconds,
        the plugins are closed, the pending listener tasks are cancelled and the store
        is closed.

        Idempotent: the first call stops the server (with its `grace`); a later or
        concurrent one waits for that stop, and a caller that is cancelled stops waiting
        without cutting the shutdown short.
        """
        if self._stopping is None:  # the first caller stops; every other one waits for it
            self._stopping = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float | None) -> None:
        grace = self.config.shutdown_grace_seconds if grace is None else grace
        await self.health.enter_graceful_shutdown()
        if self.replica is not None:
            await self.replica.stop_loops()
        if self.sweeper is not None:
            await self.sweeper.close()
        began = time.monotonic()
        if self.replica is not None:  # hand each agent over between its turns first
            await self.replica.hand_over_between_turns(grace / 2)
        closing = asyncio.ensure_future(self.factory.close())
        left = max(grace - (time.monotonic() - began), 0.0)  # one grace for both
        done, _ = await asyncio.wait({closing}, timeout=left)
        if not done:
            cancelled = self.factory.cancel_all()
            log.warning(
                "%d agent(s) did not stop within the %g s grace period; cancelling them",
                cancelled, grace,
            )  # fmt: skip
            done, _ = await asyncio.wait({closing}, timeout=CANCEL_SETTLE_SECONDS)
            if not done:
                log.error("agents still not torn down after cancelling them; going on")
                closing.cancel()
        if closing.done() and not closing.cancelled() and closing.exception() is not None:
            log.error("disposing the agents failed", exc_info=closing.exception())
        if self.replica is not None:
            await self.replica.hand_over()
        await self.server.stop(grace)
        if self.http is not None:
            await self.http.stop()
        if self.replica is not None:
            await self.replica.close()
        await self.plugins.close()
        await self.mcp.close()
        await self._health_updates.close()  # health is NOT_SERVING for good by now
        await self.runtime.seams.close()
        self.runtime.journal.close()  # a store still down now: stop retrying, say so
        await self.runtime.models.aclose()
        await self.telemetry.stop()
        await self.runtime.store.close()

    def _session_of(self, agent_id: str) -> str:
        agent = self.factory.agents.get(agent_id)
        return agent.session.session_id if agent is not None else ""

    def _labels_of(self, agent_id: str) -> Mapping[str, str] | None:
        agent = self.factory.agents.get(agent_id)
        return agent.labels if agent is not None else None

    def stop_on_signals(self) -> asyncio.Event:
        """Install SIGTERM and SIGINT handlers now; the event is set when one arrives."""
        loop = asyncio.get_running_loop()
        requested = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, requested.set)
        return requested

    async def run_until(self, requested: asyncio.Event) -> None:
        """Serve until `requested` is set (or this replica was drained), then stop gracefully."""
        waits = [asyncio.ensure_future(requested.wait())]
        if self.replica is not None:
            waits.append(asyncio.ensure_future(self.replica.drained.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        log.info("shutting down")
        await self.stop()
