"""The SDK's surfaces: a verb for every RPC, the sync client equal to the async one, and
the top-level API typed (mypy --strict refuses a wrong call to it)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

from agentloop import (
    Client,
    Conversation,
    SessionStream,
    SyncClient,
    SyncConversation,
    SyncStream,
    SyncTurn,
    Turn,
)
from agentloop.plugin.v1 import plugin_registry_service_pb2
from agentloop.surface import SERVICES, VERBS
from agentloop.v1 import agent_factory_service_pb2, agent_service_pb2
from tests.processes import REPO


def public(cls: type) -> set[str]:
    """The public methods of a class (properties and fields left out)."""
    return {
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (inspect.isfunction(member) or inspect.ismethod(member))
    }


def rpcs() -> set[str]:
    files = (agent_factory_service_pb2, agent_service_pb2, plugin_registry_service_pb2)
    services = [s for f in files for s in f.DESCRIPTOR.services_by_name.values()]
    assert sorted(s.full_name for s in services) == sorted(SERVICES)
    return {m.full_name for s in services for m in s.methods}


def test_every_rpc_of_the_public_services_has_a_verb() -> None:
    assert rpcs() == set(VERBS)
    assert set(VERBS.values()) <= public(Client)


def test_the_sync_client_has_exactly_the_async_verbs_with_the_same_parameters() -> None:
    pairs = [(Client, SyncClient), (Turn, SyncTurn), (SessionStream, SyncStream)]
    pairs.append((Conversation, SyncConversation))
    for asynchronous, synchronous in pairs:
        assert public(asynchronous) == public(synchronous), (asynchronous, synchronous)
        for name in public(asynchronous):
            expected = list(inspect.signature(getattr(asynchronous, name)).parameters)
            found = list(inspect.signature(getattr(synchronous, name)).parameters)
            assert found == expected, f"{synchronous.__name__}.{name}"


GOOD = """
import asyncio
from agentloop import AgentloopError, NotFound, TurnView, connect, connect_sync

async def main() -> None:
    client = connect("127.0.0.1:50051", token="t", timeout=5.0)
    await client.create("a", provider="scripted", tools=["word_count"], max_parallel_tool_calls=2)
    view: TurnView = await (await client.send("a", "hi")).view()
    names: list[str] = [call.name for call in view.tool_calls]
    try:
        await client.get_agent("nobody")
    except NotFound as error:
        reason: str = error.reason
    with connect_sync("127.0.0.1:50051") as sync:
        text: str = sync.send("a", "hi").view().text

asyncio.run(main())
"""

BAD = """
from agentloop import connect, connect_sync

client = connect(50051)
other = connect("127.0.0.1:50051", tokn="t")
sync = connect_sync("127.0.0.1:50051", timeout="soon")

async def main() -> None:
    await client.create("a", tool=["word_count"])
    text: int = (await (await client.send("a", "hi")).view()).text
"""


def test_mypy_strict_passes_a_right_program_and_refuses_wrong_calls(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    checked = subprocess.run(
        [
            sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
            "--cache-dir", str(REPO / ".mypy_cache" / "scratch"), "good.py", "bad.py",
        ],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(REPO / "clients" / "python")},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert not [line for line in errors if line.startswith("good.py")], checked.stdout
    lines = sorted({int(line.split(":")[1]) for line in errors if line.startswith("bad.py")})
    assert lines == [4, 5, 6, 9, 10], checked.stdout
