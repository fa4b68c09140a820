"""Replicas that serve mutual TLS forward to one another over mutual TLS.

Two servers over one real PostgreSQL, each on TLS with client certificates and a
token: a call made on the replica that does not own the agent reaches the owner,
and the owner's refusals come back with their rich details.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from agentloop.client import Client, connect
from agentloop.v1 import agent_event_pb2, agent_pb2
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from server.edge.app import App
from tests.e2e.test_contract import details
from tests.e2e.test_server_tls import TOKEN, Pki, pki, tls_config
from tests.postgres import fresh_database

T = 20

pytestmark = pytest.mark.usefixtures("without_tokens")
__all__ = ["pki"]  # the fixture, used by name


@contextlib.asynccontextmanager
async def tls_replicas(
    pki: Pki, tmp_path: Path, postgres_server: str
) -> AsyncIterator[list[Client]]:
    """Two mutual-TLS replicas over one fresh database; a certified client of each."""
    dsn = await fresh_database(postgres_server)
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for i in range(2):
            config = replace(
                tls_config(pki, tmp_path, mutual=True),
                store="postgres",
                postgres_dsn=dsn,
                replica_id=f"r{i}",
                lease_seconds=2.0,
            )
            app = App(config)
            port = await app.start()
            stack.push_async_callback(app.stop, 0)
            client = connect(
                f"127.0.0.1:{port}",
                token=TOKEN,
                ca_file=str(pki.ca),
                cert_file=str(pki.client_cert),
                key_file=str(pki.client_key),
            )
            stack.push_async_callback(client.close)
            clients.append(client)
        yield clients


async def test_a_call_on_another_replica_reaches_the_owner_over_mutual_tls(
    pki: Pki, tmp_path: Path, postgres_server: str
) -> None:
    async with tls_replicas(pki, tmp_path, postgres_server) as (owner, other):
        options = agent_pb2.AgentOptions(tools=["word_count"])
        await owner.factory.CreateAgent(
            fac.CreateAgentRequest(agent_id="a", options=options), timeout=T
        )
        sent = await other.agents.SendMessage(
            api.SendMessageRequest(agent_id="a", text="count these words"), timeout=T
        )
        assert sent.status == agent_event_pb2.AGENT_STATUS_RUNNING
        idle = await other.agents.WaitIdle(
            api.WaitIdleRequest(agent_id="a", timeout=duration_pb2.Duration(seconds=T)),
            timeout=T + 5,
        )
        assert idle.idle
        got = await other.factory.GetAgent(fac.GetAgentRequest(agent_id="a"), timeout=T)
        assert got.agent.agent_id == "a"

        with pytest.raises(grpc.aio.AioRpcError) as info:  # refused by the owner
            await other.agents.SendMessage(api.SendMessageRequest(agent_id="a"), timeout=T)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info_, bad = details(info.value)  # the details crossed both hops
        assert info_.reason
        assert bad is not None and [v.field for v in bad.field_violations] == ["text"]
