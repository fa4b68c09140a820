"""The CLI's approval verbs as real subprocesses against a real in-process server."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import sys

import grpc

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_factory_service_pb2_grpc, agent_pb2, scripted_pb2
from server.models.scripted_options import script_options
from tests.test_cli import run_cli, server, start_cli

__all__ = ["server"]  # the fixture, used by name

READ = 10.0


async def create(address: str, agent_id: str) -> None:
    """An agent whose word_count calls need approval: one call, then "done"."""
    options = agent_pb2.AgentOptions(
        provider="scripted",
        model="m",
        tools=["word_count"],
        approval_required_tools=["word_count"],
        provider_options=script_options(
            [
                scripted_pb2.ScriptedStep(
                    tool_calls=[
                        scripted_pb2.ScriptedToolCall(
                            id="w1", name="word_count", arguments='{"text": "a b c"}'
                        )
                    ]
                ),
                scripted_pb2.ScriptedStep(text="done"),
            ]
        ),
    )
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_factory_service_pb2_grpc.AgentFactoryServiceStub(channel)
        await stub.CreateAgent(
            fac.CreateAgentRequest(agent_id=agent_id, options=options), timeout=READ
        )


async def line_with(stream: asyncio.StreamReader, needle: str) -> str:
    """Read lines until one contains `needle` (bounded)."""
    async with asyncio.timeout(READ):
        while True:
            line = (await stream.readline()).decode()
            assert line, f"the output ended before {needle!r}"
            if needle in line:
                return line


async def test_send_shows_the_request_and_approve_answers_it(server: str) -> None:
    await create(server, "ap1")
    send = await start_cli(server, "send", "ap1", "count")
    assert send.stdout is not None
    line = await line_with(send.stdout, "? approval ")
    approval_id = line.split()[2].rstrip(":")
    assert "word_count(" in line and "asked by options.approval_required_tools" in line
    assert "agentloop approve|reject ap1 " + approval_id in await line_with(send.stdout, "answer")

    approved = await run_cli(server, "--json", "approve", "ap1", approval_id)
    assert approved.code == 0, approved.stderr
    resolution = json.loads(approved.stdout)["resolution"]
    assert (resolution["outcome"], resolution["resolved_by"]) == (
        "APPROVAL_OUTCOME_ALLOWED_ONCE",
        "api:cli",
    )
    rest, _ = await asyncio.wait_for(send.communicate(), READ)
    assert send.returncode == 0
    assert f"✓ approval {approval_id} allowed once by api:cli" in rest.decode()
    assert "3 words" in rest.decode()

    again = await run_cli(server, "reject", "ap1", approval_id, "--reason", "late")
    assert again.code == 2
    assert "FAILED_PRECONDITION" in again.stderr and "already resolved" in again.stderr


async def test_reject_with_a_reason_from_another_terminal(server: str) -> None:
    await create(server, "ap2")
    send = await start_cli(server, "send", "ap2", "count")
    assert send.stdout is not None
    approval_id = (await line_with(send.stdout, "? approval ")).split()[2].rstrip(":")
    listed = await run_cli(server, "approvals", "ap2")
    assert approval_id in listed.stdout
    rejected = await run_cli(server, "reject", "ap2", approval_id, "--reason", "not now")
    assert rejected.code == 0, rejected.stderr
    assert rejected.stdout == f"✓ approval {approval_id} rejected by api:cli: not now\n"
    rest, _ = await asyncio.wait_for(send.communicate(), READ)
    assert 'Error: the user rejected tool "word_count": not now' in rest.decode()
    unknown = await run_cli(server, "approve", "ap2", "ap-unknown")
    assert unknown.code == 2 and "NOT_FOUND" in unknown.stderr


async def test_send_on_a_terminal_asks_y_or_n(server: str) -> None:
    await create(server, "ap3")
    leader, follower = pty.openpty()
    try:
        env = {**os.environ, "NO_COLOR": "1"}
        env.pop("AGENTLOOP_ADDRESS", None)
        send = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "agentloop.cli", "--address", server, "send", "ap3", "x"),
            stdin=follower,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert send.stdout is not None
        await line_with(send.stdout, "? approval ")
        os.write(leader, b"y\n")
        rest, _ = await asyncio.wait_for(send.communicate(), READ)
    finally:
        os.close(leader)
        os.close(follower)
    text = rest.decode()
    assert send.returncode == 0, text
    assert "allow once? [y/N]" in text
    assert "allowed once by api:cli" in text and "3 words" in text
