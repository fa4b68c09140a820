"""Bearer tokens: the client token every RPC but health and reflection needs, the plugin
token the server sends to plugins, and the refusal to listen beyond loopback without one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.settings.config import Config
from tests.e2e.conftest import E2E, READ_TIMEOUT, Client, kinds, read_turn, running_app
from tests.e2e.registry import list_plugins, wait_state
from tests.processes import (
    PluginLauncher,
    ServerProcess,
    free_port,
    grpcurl,
    guard_example,
    server_process,
    token_free_env,
)

T = READ_TIMEOUT
"""The deadline of every call and wait."""

TOKEN = "s3cret-client-token"
PLUGIN_TOKEN = "plugin-token-X"

Metadata = tuple[tuple[str, str], ...]
RIGHT: Metadata = (("authorization", f"Bearer {TOKEN}"),)
WRONG: Metadata = (("authorization", "Bearer not-the-token"),)
NONE: Metadata = ()

pytestmark = pytest.mark.usefixtures("without_tokens")
"""Every test chooses its own tokens."""


@pytest.fixture(params=["token_file", "env"])
async def secured(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[E2E]:
    """A server requiring TOKEN, read from a token file or from $AGENTLOOP_TOKEN."""
    token_file = ""
    if request.param == "token_file":
        path = tmp_path / "token"
        path.write_text(f"{TOKEN}\n")
        token_file = str(path)
    else:
        monkeypatch.setenv("AGENTLOOP_TOKEN", TOKEN)
    async with running_app(
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


async def first_batch(server: E2E, metadata: Metadata, agent_id: str) -> Any:
    """The first response of StreamSessionEvents (read once, bounded)."""
    call = server.agents.StreamSessionEvents(
        api.StreamSessionEventsRequest(agent_id=agent_id, from_seq=0), metadata=metadata
    )
    try:
        async with asyncio.timeout(T):
            return await call.read()
    finally:
        call.cancel()


def refused_calls(server: E2E, metadata: Metadata) -> dict[str, Callable[[], Awaitable[Any]]]:
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
        "ListPlugins": lambda: server.registry.ListPlugins(
            reg.ListPluginsRequest(), metadata=metadata, timeout=T
        ),
        "RegisterPlugin": lambda: server.registry.RegisterPlugin(
            reg.RegisterPluginRequest(address="127.0.0.1:1"), metadata=metadata, timeout=T
        ),
    }


# -- the client token --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "why"), [(NONE, "missing token"), (WRONG, "wrong token")], ids=["none", "wrong"]
)
async def test_calls_without_the_right_token_are_unauthenticated(
    secured: E2E, metadata: Metadata, why: str
) -> None:
    for name, call in refused_calls(secured, metadata).items():
        details = await unauthenticated(call())
        assert why in details, (name, details)
        assert "authorization: Bearer <token>" in details, (name, details)

    # Nothing ran: no agent was created, no plugin registered.
    listed = await secured.factory.ListAgents(fac.ListAgentsRequest(), metadata=RIGHT, timeout=T)
    assert list(listed.agents) == []
    plugins = await secured.registry.ListPlugins(
        reg.ListPluginsRequest(), metadata=RIGHT, timeout=T
    )
    assert list(plugins.plugins) == []


async def test_the_right_token_works_on_every_service(secured: E2E) -> None:
    created = await secured.factory.CreateAgent(
        fac.CreateAgentRequest(agent_id="friend", options=options()), metadata=RIGHT, timeout=T
    )
    assert created.agent.agent_id == "friend"
    sent = await secured.agents.SendMessage(
        api.SendMessageRequest(agent_id="friend", text="hello"), metadata=RIGHT, timeout=T
    )
    events = await read_turn(secured.agents, "friend", sent.next_seq, metadata=RIGHT)
    assert kinds(events)[0] == "turn_start"
    assert events[-1].turn_end.reason.WhichOneof("kind") == "completed"
    plugins = await secured.registry.ListPlugins(
        reg.ListPluginsRequest(), metadata=RIGHT, timeout=T
    )
    assert list(plugins.plugins) == []


async def test_health_and_reflection_need_no_token(secured: E2E) -> None:
    for service in ("", "agentloop.v1.AgentService"):
        assert await secured.health(service) == health_pb2.HealthCheckResponse.SERVING

    services = (await grpcurl(secured.target, "list")).split()
    for name in (
        "agentloop.v1.AgentFactoryService",
        "agentloop.v1.AgentService",
        "agentloop.plugin.v1.PluginRegistryService",
        "grpc.health.v1.Health",
    ):
        assert name in services, services


# -- the plugin token --------------------------------------------------------------------


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
    launcher: PluginLauncher,
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
    plugin = await launcher.start(guard_example(lang, "--token", PLUGIN_TOKEN))
    config = Config(listen="127.0.0.1:0", store="memory", plugin_token_file=plugin_token_file)
    async with running_app(config) as server:
        request = reg.RegisterPluginRequest(address=plugin.address)
        if not accepted:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await server.registry.RegisterPlugin(request, timeout=T)
            assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "UNAUTHENTICATED" in (error.value.details() or "")
            listed = await server.registry.ListPlugins(reg.ListPluginsRequest(), timeout=T)
            assert list(listed.plugins) == []
            return
        registered = await server.registry.RegisterPlugin(request, timeout=T)
        name = registered.plugin.name
        # The Handle stream carries the token too: the plugin gets READY and serves.
        await wait_state(server.channel, name)
        assert list(await list_plugins(server.channel)) == [name]
        await server.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="a", options=options()), timeout=T
        )
        sent = await server.agents.SendMessage(
            api.SendMessageRequest(agent_id="a", text="rm -rf /"), timeout=T
        )
        events = await read_turn(server.agents, "a", sent.next_seq)
        assert kinds(events) == ["turn_start", "prompt_blocked", "turn_end"]
        assert events[-1].turn_end.reason.rejected.reason == "destructive command"


# -- listening beyond loopback -----------------------------------------------------------


@contextlib.asynccontextmanager
async def token_free_server(
    tmp_path: Path, *args: str, prelude: str = ""
) -> AsyncIterator[ServerProcess]:
    """`python -m server ARGS` with no token in its environment, in `tmp_path`.

    `prelude`, when given, is Python run in the server process before its `main`.
    """
    async with server_process(
        "--data-dir",
        str(tmp_path / "data"),
        *args,
        stderr_path=tmp_path / "server.stderr",
        cwd=tmp_path,
        env=token_free_env(),
        prelude=prelude,
    ) as server:
        yield server


async def loopback_health(port: int) -> int:
    """Health Check of the server through 127.0.0.1 (loopback only); the status."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await Client(channel).health()


async def test_a_non_loopback_listen_without_a_token_is_refused(tmp_path: Path) -> None:
    port = free_port("0.0.0.0")
    async with token_free_server(tmp_path, "--listen", f"0.0.0.0:{port}") as server:
        stdout = await server.stdout_until_exit(T)
    message = server.log()
    assert server.returncode not in (0, None), message
    assert "token" in message and "--insecure" in message, message
    assert "listening" not in stdout


async def test_a_non_loopback_listen_with_insecure_starts(tmp_path: Path) -> None:
    port = free_port("0.0.0.0")
    async with token_free_server(tmp_path, "--listen", f"0.0.0.0:{port}", "--insecure") as server:
        address = await server.listening_address()
        assert address == f"0.0.0.0:{port}", address
        # Served (through loopback): the server's event loop has run since the line.
        assert await loopback_health(port) == health_pb2.HealthCheckResponse.SERVING
        returncode = await server.terminate(T)
    assert returncode == 0, server.log()


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
        "from server.edge import app\n"
        "_run = app.App.run_until\n"
        "async def _late(self, requested):\n"
        "    time.sleep(0.5)\n"
        "    await _run(self, requested)\n"
        "app.App.run_until = _late\n"
    )
    async with token_free_server(tmp_path, "--listen", "127.0.0.1:0", prelude=prelude) as server:
        address = await server.listening_address()
        assert address.startswith("127.0.0.1:"), address
        returncode = await server.terminate(T)
    assert returncode == 0, f"exit {returncode} on a SIGTERM sent right after the listening line"


async def test_an_undecodable_body_is_unauthenticated_before_it_is_invalid(secured: E2E) -> None:
    raw = secured.channel.unary_unary(
        "/agentloop.v1.AgentFactoryService/CreateAgent",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    await unauthenticated(raw(b"\xff\xff\xff", timeout=T))
    await unauthenticated(raw(b"\xff\xff\xff", metadata=WRONG, timeout=T))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await raw(b"\xff\xff\xff", metadata=RIGHT, timeout=T)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
