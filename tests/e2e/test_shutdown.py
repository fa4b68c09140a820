"""`python -m server` as a real process: readiness, SIGTERM shutdown, config errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_factory_service_pb2_grpc, agent_pb2, agent_service_pb2_grpc
from agentloop.v1 import agent_service_pb2 as api
from tests.e2e.conftest import READ_TIMEOUT, EventStream, kinds

REPO = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT = 5.0
"""How long the server may take to exit after SIGTERM."""


def free_port() -> int:
    """A port that was free a moment ago (bound to 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_log(path: Path) -> str:
    """The server's stderr so far (for failure messages)."""
    return path.read_text()


async def start_server(*args: str, stderr_path: Path) -> asyncio.subprocess.Process:
    """Start `python -m server ARGS` with stderr going to `stderr_path`."""
    with stderr_path.open("wb") as stderr:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "server",
            *args,
            "--data-dir",
            str(stderr_path.parent / "data"),
            cwd=REPO,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


async def wait_listening(process: asyncio.subprocess.Process, stderr_path: Path) -> str:
    """Read stdout until the "agentloop listening on" line; returns the address."""
    assert process.stdout is not None
    async with asyncio.timeout(READ_TIMEOUT):
        while True:
            line = (await process.stdout.readline()).decode()
            if not line:
                await process.wait()
                raise AssertionError(
                    f"the server exited ({process.returncode}) before listening: "
                    f"{server_log(stderr_path)}"
                )
            if line.startswith("agentloop listening on "):
                return line.removeprefix("agentloop listening on ").strip()


@contextlib.asynccontextmanager
async def server_process(tmp_path: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """A running `python -m server` on a free port; killed at the end if still alive."""
    port = free_port()
    stderr_path = tmp_path / "server.stderr"
    process = await start_server("--listen", f"127.0.0.1:{port}", stderr_path=stderr_path)
    try:
        address = await wait_listening(process, stderr_path)
        assert address == f"127.0.0.1:{port}"
        yield process, address
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_sigterm_disposes_running_turns_and_exits_cleanly(tmp_path: Path) -> None:
    async with (
        server_process(tmp_path) as (process, address),
        grpc.aio.insecure_channel(address) as channel,
    ):
        factory = agent_factory_service_pb2_grpc.AgentFactoryServiceStub(channel)
        agents = agent_service_pb2_grpc.AgentServiceStub(channel)
        slow = agent_pb2.ScriptedStep(text="slow " * 200)
        slow.chunk_delay.FromMilliseconds(200)
        await factory.CreateAgent(
            fac.CreateAgentRequest(
                agent_id="s1",
                options=agent_pb2.AgentOptions(provider="scripted", model="m", script=[slow]),
            ),
            timeout=READ_TIMEOUT,
        )
        sent = await agents.SendMessage(
            api.SendMessageRequest(agent_id="s1", text="take your time"), timeout=READ_TIMEOUT
        )
        stream = EventStream(agents, agent_id="s1", from_seq=sent.next_seq)
        try:
            await stream.until("assistant_chunk")

            process.send_signal(signal.SIGTERM)
            # Keep reading while the server shuts down: the turn must end `disposed`
            # on the stream, and the stream must end by itself, before the exit.
            await stream.drain()
            code = await stream.call.code()
            async with asyncio.timeout(EXIT_TIMEOUT):
                returncode = await process.wait()
        finally:
            stream.close()

    assert returncode == 0, server_log(tmp_path / "server.stderr")
    assert code == grpc.StatusCode.OK
    assert kinds(stream.events)[-2:] == ["step_end", "turn_end"]
    assert stream.events[-1].turn_end.reason.WhichOneof("kind") == "disposed"
    assert "assistant_message" not in kinds(stream.events)
    stderr = server_log(tmp_path / "server.stderr")
    assert "shutting down" in stderr


async def test_invalid_config_exits_nonzero_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "agentloop.yaml"
    config.write_text("agents: [{id: a, maxParallelToolCalls: 0}]\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        "--config",
        str(config),
        "--listen",
        f"127.0.0.1:{free_port()}",
        cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(READ_TIMEOUT):
            stdout, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    assert process.returncode not in (0, None)
    assert "agents[0].maxParallelToolCalls" in stderr.decode()
    assert b"listening" not in stdout


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ("listen: nowhere\n", "listen"),
        ("agents: [{id: a, tools: word_count}]\n", "agents[0].tools"),
        ("agents: [{id: a}, {id: a}]\n", "agents[1].id"),
        ("bogus: 1\n", "bogus"),
    ],
    ids=["bad-listen", "tools-not-a-list", "duplicate-id", "unknown-field"],
)
async def test_other_invalid_configs_name_the_field(
    tmp_path: Path, document: str, field: str
) -> None:
    config = tmp_path / "agentloop.yaml"
    config.write_text(document)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        "--config",
        str(config),
        cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(READ_TIMEOUT):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode not in (0, None)
    assert f"{field}:" in stderr.decode()
