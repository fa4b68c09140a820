"""`python -m server` as a real process: readiness, SIGTERM shutdown, config errors."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.models.scripted_options import script_options
from tests.e2e.conftest import READ_TIMEOUT, Client, EventStream, kinds
from tests.processes import free_port, server_process


async def exits_with_error(tmp_path: Path, config: str, *args: str) -> tuple[int | None, str]:
    """Start `python -m server --config FILE ARGS` (FILE holding `config`), which must exit
    by itself (bounded); its exit code and stderr. It must not have printed the
    listening line."""
    config_path = tmp_path / "agentloop.yaml"
    config_path.write_text(config)
    async with server_process(
        "--config", str(config_path), *args, stderr_path=tmp_path / "server.stderr"
    ) as server:
        stdout = await server.stdout_until_exit(READ_TIMEOUT)
    assert "listening" not in stdout
    return server.returncode, server.log()


async def test_sigterm_disposes_running_turns_and_exits_cleanly(tmp_path: Path) -> None:
    port = free_port()
    async with server_process(
        "--listen",
        f"127.0.0.1:{port}",
        "--data-dir",
        str(tmp_path / "data"),
        stderr_path=tmp_path / "server.stderr",
    ) as server:
        address = await server.listening_address()
        assert address == f"127.0.0.1:{port}"
        async with grpc.aio.insecure_channel(address) as channel:
            client = Client(channel)
            slow = scripted_pb2.ScriptedStep(text="slow " * 200)
            slow.chunk_delay.FromMilliseconds(200)
            await client.factory.CreateAgent(
                fac.CreateAgentRequest(
                    agent_id="s1",
                    options=agent_pb2.AgentOptions(
                        provider="scripted", model="m", provider_options=script_options([slow])
                    ),
                ),
                timeout=READ_TIMEOUT,
            )
            sent = await client.agents.SendMessage(
                api.SendMessageRequest(agent_id="s1", text="take your time"),
                timeout=READ_TIMEOUT,
            )
            with EventStream(client.agents, agent_id="s1", from_seq=sent.next_seq) as stream:
                await stream.until("assistant_chunk")

                server.process.send_signal(signal.SIGTERM)
                # Keep reading while the server shuts down: the turn must end `disposed`
                # on the stream, and the stream must end by itself, before the exit.
                await stream.drain()
                code = await stream.call.code()
                returncode = await server.wait_exit()

    assert returncode == 0, server.log()
    assert code == grpc.StatusCode.OK
    assert kinds(stream.events)[-2:] == ["step_end", "turn_end"]
    assert stream.events[-1].turn_end.reason.WhichOneof("kind") == "disposed"
    assert "assistant_message" not in kinds(stream.events)
    assert "shutting down" in server.log()


async def test_invalid_config_exits_nonzero_naming_the_field(tmp_path: Path) -> None:
    returncode, stderr = await exits_with_error(
        tmp_path,
        "agents: [{id: a, maxParallelToolCalls: 0}]\n",
        "--listen",
        f"127.0.0.1:{free_port()}",
    )
    assert returncode not in (0, None)
    assert "agents[0].maxParallelToolCalls" in stderr


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
    returncode, stderr = await exits_with_error(tmp_path, document)
    assert returncode not in (0, None)
    assert f"{field}:" in stderr
