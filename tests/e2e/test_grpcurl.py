"""The real grpcurl binary against the real server: reflection, JSON in, JSON out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.e2e.conftest import E2E
from tests.processes import grpcurl

BUF = Path(__file__).resolve().parents[2] / "node_modules" / ".bin" / "buf"
"""The buf CLI that `make setup` installs from npm."""


async def test_list_shows_every_service(e2e: E2E) -> None:
    services = (await grpcurl(e2e.target, "list")).split()
    for name in (
        "agentloop.v1.AgentFactoryService",
        "agentloop.v1.AgentService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ):
        assert name in services, services


async def test_describe_agent_service(e2e: E2E) -> None:
    description = await grpcurl(e2e.target, "describe", "agentloop.v1.AgentService")
    assert "agentloop.v1.AgentService is a service" in description
    for method in ("SendMessage", "StreamSessionEvents", "WaitIdle", "ListSessionEvents"):
        assert f"rpc {method}" in description


async def run_word_count_turn(e2e: E2E, agent_id: str, options: dict[str, Any]) -> list[Any]:
    """CreateAgent, SendMessage, WaitIdle, ListSessionEvents, all via grpcurl; the events."""
    created = json.loads(
        await grpcurl(
            e2e.target,
            "agentloop.v1.AgentFactoryService/CreateAgent",
            data={"agent_id": agent_id, "options": options},
        )
    )
    # grpcurl prints the proto field names.
    assert created["agent"]["agent_id"] == agent_id
    assert created["agent"]["session_id"].startswith(f"{agent_id}-session-")
    assert created["agent"]["status"] == "AGENT_STATUS_IDLE"

    sent = json.loads(
        await grpcurl(
            e2e.target,
            "agentloop.v1.AgentService/SendMessage",
            data={"agent_id": agent_id, "text": "count my four words"},
        )
    )
    assert sent["next_seq"] == "1"  # seqs start at 1: JSON shows them all

    idle = json.loads(
        await grpcurl(
            e2e.target,
            "agentloop.v1.AgentService/WaitIdle",
            data={"agent_id": agent_id, "timeout": "5s"},
        )
    )
    assert idle["idle"] is True
    assert idle["status"] == "AGENT_STATUS_IDLE"

    listed = json.loads(
        await grpcurl(
            e2e.target,
            "agentloop.v1.AgentService/ListSessionEvents",
            data={"agent_id": agent_id, "page_size": 50},
        )
    )
    events: list[Any] = listed["events"]
    assert [e["seq"] for e in events] == [str(i) for i in range(1, len(events) + 1)]
    assert int(idle["next_seq"]) == len(events) + 1
    assert "turn_start" in events[0]
    assert "turn_end" in events[-1], events[-1]
    return events


def assert_word_count_round_trip(events: list[Any]) -> None:
    """The events are one completed turn with a word_count round trip."""
    assert events[-1]["turn_end"]["reason"] == {"completed": {}}, events[-1]
    results = [e["tool_result"] for e in events if "tool_result" in e]
    assert [r["content"][0]["text"]["text"] for r in results] == ["4 words"]
    answers = [e["assistant_message"] for e in events if "assistant_message" in e]
    assert answers[-1]["content"][0]["text"]["text"] == "Tool results: 4 words"


async def test_a_turn_driven_by_grpcurl(e2e: E2E) -> None:
    events = await run_word_count_turn(e2e, "g0", {"model": "m", "tools": ["word_count"]})
    assert_word_count_round_trip(events)


async def test_readme_walkthrough_agent_without_a_model(e2e: E2E) -> None:
    """The README's CreateAgent body names no model: "Empty means the provider's default"."""
    events = await run_word_count_turn(e2e, "g1", {"tools": ["word_count"]})
    assert_word_count_round_trip(events)


async def test_a_script_is_the_scripted_providers_own_options_as_an_any(e2e: E2E) -> None:
    """The README's scripted agent: `provider_options` as JSON with its `@type`."""
    script = {
        "@type": "type.googleapis.com/agentloop.v1.ScriptedOptions",
        "steps": [{"text": "scripted answer"}],
    }
    await grpcurl(
        e2e.target,
        "agentloop.v1.AgentFactoryService/CreateAgent",
        data={"agent_id": "g2", "options": {"provider_options": script}},
    )
    await grpcurl(
        e2e.target,
        "agentloop.v1.AgentService/SendMessage",
        data={"agent_id": "g2", "text": "hi"},
    )
    await grpcurl(
        e2e.target, "agentloop.v1.AgentService/WaitIdle", data={"agent_id": "g2", "timeout": "5s"}
    )
    listed = json.loads(
        await grpcurl(
            e2e.target, "agentloop.v1.AgentService/ListSessionEvents", data={"agent_id": "g2"}
        )
    )
    messages = [e["assistant_message"] for e in listed["events"] if "assistant_message" in e]
    assert messages[-1]["content"][0]["text"]["text"] == "scripted answer"


async def test_describe_a_single_method_shows_its_comment(e2e: E2E) -> None:
    described = await grpcurl(e2e.target, "describe", "agentloop.v1.AgentService.SendMessage")
    assert "rpc SendMessage ( .agentloop.v1.SendMessageRequest )" in described, described
    assert "SendMessage queues a prompt" in described  # comments come with source info
    message = await grpcurl(e2e.target, "describe", "agentloop.v1.SendMessageRequest")
    assert "Required. The live agent to send to." in message, message


async def test_reflection_v1_serves_buf_curl(e2e: E2E) -> None:
    """`buf curl` speaks reflection v1 only (grpcurl 1.8 speaks v1alpha)."""
    buf = BUF
    process = await asyncio.create_subprocess_exec(
        str(buf), "curl", "--protocol", "grpc", "--http2-prior-knowledge",
        "--reflect-protocol", "grpc-v1", "--data", '{"page_size": 5}',
        f"http://{e2e.target}/agentloop.v1.AgentFactoryService/ListAgents",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    assert "agents" in json.loads(stdout or b"{}") or stdout.strip() == b"{}"
