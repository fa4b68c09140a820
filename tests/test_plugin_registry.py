"""Plugin registration without a plugin process: descriptions are checked, and a
registration is all or nothing (a refused, failed or cancelled one leaves no listener,
no tool, no model, no registry entry and no open channel)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import struct_pb2

from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.kernel import seams as S
from server.kernel.errors import FailedPrecondition
from server.kernel.tools import Tool, ToolExecution
from server.loop.runtime import Runtime
from server.models.scripted import ScriptedModel
from server.plugins.calls import PluginStats
from server.plugins.connection import PluginConnection
from server.plugins.install import install
from server.plugins.registry import Overrides, PluginRegistry

T = 5.0
"""A hang guard, never a measured time."""

ADDRESS = "127.0.0.1:1"
"""Never dialled: `Describe` is faked and the stream is never started."""


class FakePlugin:
    """Fakes `PluginConnection.describe` and counts the connections closed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.description = hk.DescribeResponse(name="p", version="1")
        self.closed = 0
        self.describing = asyncio.Event()
        self.hang = False
        fake = self
        close = PluginConnection.close

        async def describe(connection: PluginConnection, seconds: float) -> hk.DescribeResponse:
            fake.describing.set()
            if fake.hang:
                await asyncio.Event().wait()
            return fake.description

        async def counted_close(connection: PluginConnection) -> None:
            fake.closed += 1
            await close(connection)

        monkeypatch.setattr(PluginConnection, "describe", describe)
        monkeypatch.setattr(PluginConnection, "close", counted_close)


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> FakePlugin:
    return FakePlugin(monkeypatch)


@pytest.fixture
def runtime() -> Runtime:
    return Runtime()


def prompt_submit() -> hk.Subscription:
    return hk.Subscription(seam=hk.SEAM_PROMPT_SUBMIT)


def tool(name: str = "plugin_tool", **schema: Any) -> hk.ToolDefinition:
    input_schema = struct_pb2.Struct()
    input_schema.update({"type": "object", **schema})
    return hk.ToolDefinition(name=name, description="d", input_schema=input_schema)


def nothing_left(runtime: Runtime, registry: PluginRegistry) -> None:
    """No trace of plugin "p": no entry, listener, tool or model."""
    assert registry.plugins == {}
    assert runtime.seams.listeners(S.PROMPT_SUBMIT, "a1") == []
    assert "plugin_tool" not in runtime.tools.names()
    assert "plugin_model" not in runtime.models.names()


def with_timeout(message: Any, nanos: int) -> Any:
    message.timeout.FromNanoseconds(nanos)
    return message


INVALID: list[tuple[str, Callable[[hk.DescribeResponse], None], str]] = [
    (
        "reserved-seam",  # 13 was SEAM_TOOL_EXECUTE: tool calls are a call kind now
        lambda d: d.subscriptions.append(hk.Subscription(seam=13)),  # type: ignore[arg-type]
        "seam 13",
    ),
    (
        "unknown-seam",
        lambda d: d.subscriptions.append(hk.Subscription(seam=99)),  # type: ignore[arg-type]
        "seam 99",
    ),
    (
        "unspecified-seam",
        lambda d: d.subscriptions.append(hk.Subscription()),
        "SEAM_UNSPECIFIED",
    ),
    (
        "unknown-event-kind",
        lambda d: d.subscriptions.append(
            hk.Subscription(seam=hk.SEAM_SESSION_EVENTS, event_kinds=["turn_ended"])
        ),
        "unknown session event kinds ['turn_ended']",
    ),
    (
        "unknown-failure-policy",
        lambda d: d.subscriptions.append(
            hk.Subscription(seam=hk.SEAM_PRE_STEP, failure_policy=7)  # type: ignore[arg-type]
        ),
        "failure policy",
    ),
    (
        "zero-subscription-timeout",
        lambda d: d.subscriptions.append(with_timeout(hk.Subscription(seam=hk.SEAM_PRE_STEP), 0)),
        "timeout of zero or less",
    ),
    (
        "negative-subscription-timeout",
        lambda d: d.subscriptions.append(
            with_timeout(hk.Subscription(seam=hk.SEAM_PRE_STEP), -1_000_000)
        ),
        "timeout of zero or less",
    ),
    (
        "nan-in-a-tool-schema",
        lambda d: d.tools.append(tool("nan_tool", maximum=float("nan"))),
        'tool "nan_tool"',
    ),
    (
        "infinity-in-a-tool-schema",
        lambda d: d.tools.append(tool("inf_tool", maximum=float("inf"))),
        'tool "inf_tool"',
    ),
    (
        "zero-tool-timeout",
        lambda d: d.tools.append(with_timeout(tool("slow_tool"), 0)),
        'tool "slow_tool" has a timeout of zero or less',
    ),
    (
        "negative-model-timeout",
        lambda d: d.models.append(
            with_timeout(hk.ModelProviderDefinition(provider="other_model"), -1)
        ),
        'model provider "other_model" has a timeout of zero or less',
    ),
]


@pytest.mark.parametrize(("spoil", "problem"), [(s, p) for _, s, p in INVALID],
                         ids=[i for i, _, _ in INVALID])  # fmt: skip
async def test_an_invalid_description_is_refused_and_leaves_nothing(
    plugin: FakePlugin,
    runtime: Runtime,
    spoil: Callable[[hk.DescribeResponse], None],
    problem: str,
) -> None:
    # Valid parts first: a partial install would leave them behind.
    plugin.description.subscriptions.append(prompt_submit())
    plugin.description.tools.append(tool())
    plugin.description.models.append(hk.ModelProviderDefinition(provider="plugin_model"))
    spoil(plugin.description)
    registry = PluginRegistry(runtime, lambda agent_id: "", "")

    with pytest.raises(FailedPrecondition) as refused:
        await registry.register(ADDRESS, Overrides())

    assert f"the plugin at {ADDRESS} describes itself invalidly: " in str(refused.value)
    assert problem in str(refused.value)
    nothing_left(runtime, registry)
    assert plugin.closed == 1


async def test_a_failing_install_leaves_nothing_and_closes_the_connection(
    plugin: FakePlugin, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin.description.subscriptions.append(prompt_submit())
    registry = PluginRegistry(runtime, lambda agent_id: "", "")
    seen_during_install: list[list[str]] = []

    def failing_install(*args: Any, **kwargs: Any) -> list[Callable[[], None]]:
        seen_during_install.append(list(registry.plugins))
        raise RuntimeError("install broke")

    monkeypatch.setattr("server.plugins.registry.install", failing_install)

    with pytest.raises(RuntimeError, match="install broke"):
        await registry.register(ADDRESS, Overrides())

    assert seen_during_install == [[]]  # not published before it is installed
    nothing_left(runtime, registry)
    assert plugin.closed == 1


async def test_a_valid_description_is_installed_then_removed(
    plugin: FakePlugin, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def ready(connection: PluginConnection, seconds: float) -> bool:
        return True

    monkeypatch.setattr(PluginConnection, "start", lambda connection: None)
    monkeypatch.setattr(PluginConnection, "wait_ready", ready)
    plugin.description.subscriptions.append(prompt_submit())
    plugin.description.tools.append(with_timeout(tool(), 1_000_000_000))
    plugin.description.models.append(hk.ModelProviderDefinition(provider="plugin_model"))
    registry = PluginRegistry(runtime, lambda agent_id: "", "")

    registered = await registry.register(ADDRESS, Overrides())

    assert list(registry.plugins) == ["p"] and registered.name == "p"
    assert len(runtime.seams.listeners(S.PROMPT_SUBMIT, "a1")) == 1
    assert "plugin_tool" in runtime.tools.names()
    assert "plugin_model" in runtime.models.names()
    await registry.unregister("p")
    nothing_left(runtime, registry)
    assert plugin.closed == 1


async def test_a_cancelled_config_retry_closes_its_connection(
    plugin: FakePlugin, runtime: Runtime
) -> None:
    plugin.hang = True
    registry = PluginRegistry(runtime, lambda agent_id: "", "")
    registry.register_in_background(ADDRESS, Overrides())
    async with asyncio.timeout(T):
        await plugin.describing.wait()

        await registry.close()

    assert plugin.closed == 1
    nothing_left(runtime, registry)


def test_install_is_all_or_nothing(runtime: Runtime) -> None:
    async def body(exec: ToolExecution) -> str:
        return "local"

    runtime.tools.register(Tool("plugin_tool", "taken", {"type": "object"}, body))
    runtime.models.register("plugin_model", ScriptedModel())
    tools_before = runtime.tools.names()

    # The listener and the first tool are registered, then the taken model name fails.
    with pytest.raises(ValueError, match="plugin_model"):
        install(
            "p", [prompt_submit()], [tool("fresh_tool")], caller=None,  # type: ignore[arg-type]
            stats=PluginStats(), seams=runtime.seams, registry=runtime.tools,
            session_of=lambda agent_id: "",
            models=[hk.ModelProviderDefinition(provider="plugin_model")],
            model_registry=runtime.models,
        )  # fmt: skip

    assert runtime.seams.listeners(S.PROMPT_SUBMIT, "a1") == []
    assert runtime.tools.names() == tools_before
