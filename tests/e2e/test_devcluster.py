"""`make cluster`: an embedded PostgreSQL and replicas, started and stopped in one command."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import grpc

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_factory_service_pb2_grpc as fac_rpc
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import agent_service_pb2_grpc as api_rpc
from tests.processes import REPO, read_line, wait_exit


async def test_the_dev_cluster_starts_serves_from_any_replica_and_stops(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server.cluster.devcluster", "--replicas", "2", "--port", "0",
        "--data-dir", str(tmp_path / "cluster"), "--lease-seconds", "2",
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        lines: list[str] = []
        while not lines or "cluster ready" not in lines[-1]:
            lines.append(await read_line(process, 30))
        addresses = re.findall(r"listening on (\S+)", "\n".join(lines))
        assert len(addresses) == 2, lines
        first, second = (grpc.aio.insecure_channel(a) for a in addresses)
        async with first, second:
            created = await fac_rpc.AgentFactoryServiceStub(first).CreateAgent(
                fac.CreateAgentRequest(agent_id="dev"), timeout=10
            )
            sent = await api_rpc.AgentServiceStub(second).SendMessage(  # forwarded to its owner
                api.SendMessageRequest(agent_id="dev", text="hello"), timeout=10
            )
            assert created.agent.session_id and sent.next_seq >= 0
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
    assert await wait_exit(process, 30) == 0
