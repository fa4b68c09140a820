"""A bare `HookService` for the benchmark: answers every call at once, no SDK.

Prints "plugin echo listening on HOST:PORT" when ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

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
