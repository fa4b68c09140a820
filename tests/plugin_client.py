"""The loop's side of a Python plugin served in-process: a HookService client and a
`Handle` stream written and read as the loop does."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import grpc

from agentloop.plugin import sdk
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.plugin.v1 import hook_service_pb2_grpc
from agentloop.v1 import stream_pb2

if TYPE_CHECKING:
    from agentloop.plugin.v1.hook_service_pb2_grpc import HookServiceAsyncStub

EXAMPLES = Path(__file__).parent.parent / "clients" / "python" / "examples"
T = 5.0
"""The longest any single wait may take."""

ProbeT = TypeVar("ProbeT")


def load_example(filename: str) -> ModuleType:
    """The example plugin module `clients/python/examples/FILENAME`, loaded from its file."""
    path = EXAMPLES / filename
    spec = importlib.util.spec_from_file_location(f"{path.stem}_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.asynccontextmanager
async def serving(plugin: sdk.Plugin) -> AsyncIterator[str]:
    """Serve `plugin` on a free loopback port; yields its address; stops it on exit."""
    port = await plugin.serve("127.0.0.1:0")
    assert port > 0
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await plugin.stop(grace=0)


@contextlib.asynccontextmanager
async def hook_client(plugin: sdk.Plugin) -> AsyncIterator[HookServiceAsyncStub]:
    """Serve `plugin` (as `serving` does) and yield a HookService client to it."""
    async with serving(plugin) as address, grpc.aio.insecure_channel(address) as channel:
        yield hook_service_pb2_grpc.HookServiceStub(channel)


@dataclass
class PluginLoop(Generic[ProbeT]):
    """The loop's side of a running plugin: the plugin, what its test handlers saw
    (`probe`), and a HookService client to it."""

    plugin: sdk.Plugin
    probe: ProbeT
    stub: HookServiceAsyncStub


@contextlib.asynccontextmanager
async def looping(plugin: sdk.Plugin, probe: ProbeT) -> AsyncIterator[PluginLoop[ProbeT]]:
    """Serve `plugin` and yield the loop's side of it."""
    async with hook_client(plugin) as stub:
        yield PluginLoop(plugin, probe, stub)


class HandleStream:
    """One Handle stream, written and read as the loop does; every read is bounded."""

    def __init__(self, stub: HookServiceAsyncStub, metadata: Any = None) -> None:
        self.call = stub.Handle(metadata=metadata)

    async def send(self, *calls: hs.HookCall) -> None:
        for call in calls:
            await self.call.write(hs.HandleRequest(call=call))

    async def cancel(self, call_id: str) -> None:
        await self.call.write(hs.HandleRequest(cancel=hs.CancelCall(call_id=call_id, reason="x")))

    async def response(self) -> hs.HandleResponse:
        """The next response (a result or a model chunk)."""
        async with asyncio.timeout(T):
            response = await self.call.read()
        assert response is not grpc.aio.EOF
        assert isinstance(response, hs.HandleResponse)
        return response

    async def result(self) -> hs.HookResult:
        """The result the next response carries."""
        return (await self.response()).result

    async def chunks(self, call_id: str) -> list[stream_pb2.StreamChunk]:
        """Read one model call's chunks up to its finish (the only call in flight)."""
        chunks = []
        while True:
            response = await self.response()
            assert response.WhichOneof("kind") == "chunk", response
            assert response.chunk.call_id == call_id
            chunks.append(response.chunk.chunk)
            if response.chunk.chunk.HasField("finish"):
                return chunks

    async def finish(self) -> list[hs.HandleResponse]:
        """Close the loop's side; what the plugin still sends before ending the stream."""
        await self.call.done_writing()
        rest = []
        async with asyncio.timeout(T):
            while (response := await self.call.read()) is not grpc.aio.EOF:
                assert isinstance(response, hs.HandleResponse)
                rest.append(response)
        assert await self.call.code() == grpc.StatusCode.OK
        return rest
