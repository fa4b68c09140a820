"""The `agentloop` CLI as a real subprocess against a real in-process server."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from agentloop.v1 import (
    agent_factory_service_pb2,
    agent_factory_service_pb2_grpc,
    agent_pb2,
    scripted_pb2,
)
from server.edge.app import App
from server.models.scripted_options import script_options
from server.settings.config import AgentConfig, Config

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """A real server on a free port with the default scripted "assistant"; yields host:port."""
    app = App(
        Config(
            listen="127.0.0.1:0",
            store="memory",  # the default sqlite store would share ./data across runs
            agents=(
                AgentConfig(
                    id="assistant",
                    provider="scripted",
                    model="echo",
                    tools=("current_time", "word_count"),
                ),
            ),
        )
    )
    port = await app.start()
    yield f"127.0.0.1:{port}"
    await app.stop(grace=0)


# Runs the CLI like `-m agentloop.cli`, but with Ctrl-C restored: a child of a shell's
# background job inherits SIGINT ignored, and Python then never raises KeyboardInterrupt.
WITH_SIGINT = (
    "-c",
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('agentloop.cli', run_name='__main__', alter_sys=True)",
)


async def start_cli(
    address: str, *args: str, launch: tuple[str, ...] = ("-m", "agentloop.cli")
) -> asyncio.subprocess.Process:
    # Async on purpose: the server serves on this event loop, so blocking would deadlock.
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("AGENTLOOP_ADDRESS", None)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *launch,
        "--address",
        address,
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def run_cli(address: str, *args: str, wait: float = 30) -> Result:
    proc = await start_cli(address, *args)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), wait)
    assert proc.returncode is not None
    return Result(proc.returncode, stdout.decode(), stderr.decode())


async def test_send_streams_the_turn(server: str) -> None:
    result = await run_cli(server, "send", "assistant", "count these four words")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("→ tool word_count(") for line in lines)
    assert "← word_count: 4 words" in lines
    assert "Tool results: 4 words" in lines  # the streamed answer text
    assert lines[-1] == "[turn 1 completed]"


async def test_steer_when_idle_is_a_send(server: str) -> None:
    result = await run_cli(server, "send", "--steer", "assistant", "count these four words")
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[turn 1 completed]"


async def test_create_then_agents_lists_it(server: str) -> None:
    created = await run_cli(
        server, "create", "helper", "--tool", "word_count", "--session-id", "helper-s1"
    )
    assert created.code == 0, created.stderr
    assert "helper" in created.stdout
    assert "helper-s1" in created.stdout
    assert "idle" in created.stdout
    listed = await run_cli(server, "agents")
    assert listed.code == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["AGENT", "STATUS", "SESSION"]
    assert ["helper", "idle", "helper-s1"] in rows
    assert [r[0] for r in rows[1:]] == ["assistant", "helper"]


async def test_create_twice_is_already_exists(server: str) -> None:
    result = await run_cli(server, "create", "assistant")
    assert result.code == 2
    assert result.stderr.startswith("agentloop: ALREADY_EXISTS: ")


async def test_send_to_unknown_agent_is_not_found(server: str) -> None:
    result = await run_cli(server, "send", "nobody", "hello")
    assert result.code == 2
    assert "agentloop: NOT_FOUND:" in result.stderr
    assert result.stdout == ""


async def test_tail_no_follow_prints_the_log(server: str) -> None:
    sent = await run_cli(server, "send", "assistant", "count these four words")
    assert sent.code == 0, sent.stderr
    result = await run_cli(server, "tail", "assistant", "--no-follow")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["1", "turn_start"]
    assert lines[-1].split() == ["24", "turn_end", "turn", "1", "completed"]
    assert any("tool_call" in line and "word_count" in line for line in lines)
    # Every line is `seq kind summary`, in sequence order.
    assert [int(line.split()[0]) for line in lines] == list(range(1, len(lines) + 1))
    later = await run_cli(server, "tail", "assistant", "--no-follow", "--from", "21")
    assert [line.split()[0] for line in later.stdout.splitlines()] == ["21", "22", "23", "24"]


async def test_cancel_and_dispose(server: str) -> None:
    idle = await run_cli(server, "cancel", "assistant")
    assert idle.code == 0, idle.stderr
    assert "nothing to cancel" in idle.stdout
    disposed = await run_cli(server, "dispose", "assistant")
    assert disposed.code == 0, disposed.stderr
    assert disposed.stdout.startswith("disposed assistant (session assistant-session-")
    listed = await run_cli(server, "agents")
    assert listed.stdout.splitlines() == ["AGENT  STATUS  SESSION"]
    again = await run_cli(server, "dispose", "assistant")
    assert again.code == 2
    assert "NOT_FOUND" in again.stderr or "FAILED_PRECONDITION" in again.stderr


async def test_ctrl_c_cancels_the_turn(server: str) -> None:
    slow = scripted_pb2.ScriptedStep(
        text="slowly " * 50, chunk_size=2, chunk_delay=duration_pb2.Duration(nanos=50_000_000)
    )
    async with grpc.aio.insecure_channel(server) as channel:
        await agent_factory_service_pb2_grpc.AgentFactoryServiceStub(channel).CreateAgent(
            agent_factory_service_pb2.CreateAgentRequest(
                agent_id="slow",
                options=agent_pb2.AgentOptions(
                    provider="scripted", model="echo", provider_options=script_options([slow])
                ),
            )
        )
    proc = await start_cli(server, "send", "slow", "go", launch=WITH_SIGINT)
    assert proc.stdout is not None
    # Interrupt only once text streams: the CLI is then inside the stream loop.
    first = await asyncio.wait_for(proc.stdout.read(2), 20)
    assert first == b"sl"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 1, stderr
    assert stdout.decode().splitlines()[-1] == "[turn 1 aborted: user interrupt]"
    assert "cancelling the turn" in stderr.decode()


async def test_unreachable_server_says_so() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and now has no listener
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    result = await run_cli(address, "agents", wait=20)
    assert result.code != 0
    assert f"cannot reach agentloop at {address}: is the server running? (make run)" in (
        result.stderr
    )


async def test_tail_needs_exactly_one_target(server: str) -> None:
    result = await run_cli(server, "tail")
    assert result.code == 2
    assert "exactly one of AGENT_ID or --session-id" in result.stderr
