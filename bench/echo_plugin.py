"""A bare `HookService` for the benchmark: answers every call at once, no SDK.

It loads gRPC as the plugin helper does (`agentloop.plugin.polling`), so that the bare
ping-pong and a call through the helper differ only by the code on their path.

Prints "plugin echo listening on HOST:PORT" when ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any

with suppress(ImportError):  # the helper's gRPC settings (a baseline's helper may have none)
    from agentloop.plugin import polled_listener  # noqa: F401

import grpc

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import hook_service_pb2_grpc as hk_rpc


class Echo(hk_rpc.HookServiceServicer):
    """Subscribes to nothing; answers each call with an empty result."""

    async def Describe(self, request: hk.DescribeRequest, context: Any) -> hk.DescribeResponse:
        return hk.DescribeResponse(name="echo", version="bench")

    async def Handle(
        self, requests: AsyncIterator[hk.HandleRequest], context: Any
    ) -> AsyncIterator[hk.HandleResponse]:
        async for request in requests:
            if request.HasField("call"):
                yield hk.HandleResponse(result=hk.HookResult(call_id=request.call.call_id))


async def main() -> None:
    server = grpc.aio.server()
    hk_rpc.add_HookServiceServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"plugin echo listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
