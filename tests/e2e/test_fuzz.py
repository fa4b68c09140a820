"""A fuzz suite: requests for every RPC built from the proto descriptors, and raw bodies.

Whatever a client sends, the server answers with a status that is the client's to fix
(never UNKNOWN, INTERNAL, UNAVAILABLE or DATA_LOSS), logs no traceback and no ERROR, and
is healthy afterwards. The server is a real `python -m server` process.

$AGENTLOOP_FUZZ_EXAMPLES sets the examples per RPC (default 30: CI stays quick).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop.plugin.v1 import plugin_registry_service_pb2
from agentloop.v1 import agent_factory_service_pb2, agent_service_pb2
from agentloop.v1 import agent_factory_service_pb2 as fac
from tests.e2e.fuzz_messages import AGENT_ID, SESSION_ID, messages
from tests.processes import REPO, SERVER_LISTENING, STARTUP_TIMEOUT, token_free_env

EXAMPLES = int(os.environ.get("AGENTLOOP_FUZZ_EXAMPLES", "30"))

SERVICES = [
    agent_factory_service_pb2.DESCRIPTOR.services_by_name["AgentFactoryService"],
    agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"],
    plugin_registry_service_pb2.DESCRIPTOR.services_by_name["PluginRegistryService"],
]
METHODS = [method for service in SERVICES for method in service.methods]

SERVER_FAULTS = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
}
"""Statuses that say the server, not the request, is at fault."""

CALL_SECONDS = 1.0
"""Each unary call's deadline: a WaitIdle may legitimately wait; DEADLINE_EXCEEDED is fine."""
STREAM_SECONDS = 0.2
"""How long a StreamSessionEvents call is read before the fuzzer hangs up."""

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("AGENTLOOP_FUZZ_RANDOM", "") == "",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
"""Derandomized by default (CI is repeatable); $AGENTLOOP_FUZZ_RANDOM=1 explores anew."""


class FuzzServer:
    """A server process and a plain channel to it."""

    def __init__(self, process: subprocess.Popen[bytes], target: str, log: Path) -> None:
        self.process = process
        self.channel = grpc.insecure_channel(target)
        self.log = log

    def call(self, path: str, body: bytes, server_streaming: bool) -> grpc.StatusCode:
        """Send `body` to `path`; the status it ended with (OK when a stream was cut)."""
        identity: Any = lambda data: data  # noqa: E731 - raw bytes both ways
        try:
            if not server_streaming:
                self.channel.unary_unary(path, identity, identity)(body, timeout=CALL_SECONDS)
                return grpc.StatusCode.OK
            responses = self.channel.unary_stream(path, identity, identity)(
                body, timeout=STREAM_SECONDS
            )
            for _ in responses:
                pass
            return grpc.StatusCode.OK
        except grpc.RpcError as error:
            return error.code()

    def healthy(self) -> bool:
        """The health service says SERVING."""
        stub: Any = health_pb2_grpc.HealthStub(self.channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzServer]:
    """One server for the whole suite, with the live agent the fuzzer aims at."""
    directory = tmp_path_factory.mktemp("fuzz")
    config = directory / "config.yaml"
    config.write_text("store: memory\nagents: []\n")
    log = directory / "server.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "server", "--config", str(config), "--listen", "127.0.0.1:0"],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
            env={**token_free_env(), "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    server: FuzzServer | None = None
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode().strip()
        match = SERVER_LISTENING.fullmatch(line)
        assert match, f"the server printed {line!r}: {log.read_text()}"
        server = FuzzServer(process, match.group(1), log)
        grpc.channel_ready_future(server.channel).result(timeout=STARTUP_TIMEOUT)
        server.channel.unary_unary(
            "/agentloop.v1.AgentFactoryService/CreateAgent",
            fac.CreateAgentRequest.SerializeToString,
            fac.CreateAgentResponse.FromString,
        )(fac.CreateAgentRequest(agent_id=AGENT_ID, session_id=SESSION_ID), timeout=5)
        yield server
        assert server.healthy(), "the server is not SERVING after the fuzz suite"
        logged = log.read_text()
        assert "Traceback" not in logged, logged[-4000:]
        assert " ERROR " not in logged, logged[-4000:]  # client mistakes: INFO at most
    finally:
        process.kill()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
        if server is not None:
            server.channel.close()


def path_of(method: Any) -> str:
    """The HTTP/2 path of a method descriptor."""
    return f"/{method.containing_service.full_name}/{method.name}"


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_generated_requests_get_client_statuses(fuzz_server: FuzzServer, method: Any) -> None:
    @FUZZ_SETTINGS
    @given(messages(method.input_type))
    def check(request: Any) -> None:
        status = fuzz_server.call(
            path_of(method), request.SerializeToString(), method.server_streaming
        )
        assert status not in SERVER_FAULTS, f"{method.name}({request}) -> {status}"

    check()
    assert fuzz_server.healthy()


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_raw_bodies_get_client_statuses(fuzz_server: FuzzServer, method: Any) -> None:
    @FUZZ_SETTINGS
    @given(st.binary(max_size=64))
    def check(body: bytes) -> None:
        status = fuzz_server.call(path_of(method), body, method.server_streaming)
        assert status not in SERVER_FAULTS, f"{method.name}({body!r}) -> {status}"

    check()
    # A body no message parses is refused as the client's mistake.
    refused = fuzz_server.call(path_of(method), b"\xff\xff\xff", method.server_streaming)
    assert refused == grpc.StatusCode.INVALID_ARGUMENT
