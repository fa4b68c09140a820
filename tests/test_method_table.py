"""The method table: services registered by their generated code, served as one generic handler."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from server.edge.api_reflection import Reflection
from server.edge.method_table import MethodTable


async def test_a_real_server_serves_the_table_and_refuses_unknown_methods() -> None:
    table = MethodTable()
    registrar: Any = table  # stands in for the server while the services register
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, registrar)
    Reflection((health.SERVICE_NAME,)).add_to(registrar)
    # The generated code gave health twice (generic, then registered): kept once.
    assert {name.rsplit("/", 1)[1] for name in table.methods} == {"Check", "List", "Watch"}
    assert len(table.others) == 2  # reflection's two protocol versions, generic only
    server = grpc.aio.server()
    table.install(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            checking: Any = health_pb2_grpc.HealthStub(channel)  # typeshed's has no methods
            answer = await checking.Check(health_pb2.HealthCheckRequest())
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            unknown: Any = channel.unary_unary("/grpc.health.v1.Health/Nothing")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await unknown(b"")
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
            reflection: Any = channel.stream_stream(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
            )
            call = reflection()
            await call.write(b"\x3a\x00")  # list_services = ""
            listed = await call.read()
            assert health.SERVICE_NAME.encode() in listed
            await call.done_writing()
    finally:
        await server.stop(grace=0)


async def test_the_edge_wraps_each_found_handler_and_the_server_needs_no_interceptor() -> None:
    table = MethodTable()
    registrar: Any = table
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), registrar)
    Reflection((health.SERVICE_NAME,)).add_to(registrar)
    seen: list[str] = []

    def edge(handler: Any, details: grpc.HandlerCallDetails) -> Any:
        seen.append(details.method or "")

        async def refused(request: Any, context: Any) -> Any:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the edge said no")

        return grpc.unary_unary_rpc_method_handler(refused) if handler.unary_unary else handler

    table.edge = edge
    server = grpc.aio.server()  # no interceptors
    table.install(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            checking: Any = health_pb2_grpc.HealthStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await checking.Check(health_pb2.HealthCheckRequest())
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            unknown: Any = channel.unary_unary("/grpc.health.v1.Health/Nothing")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await unknown(b"")
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED  # not the edge's
            reflection: Any = channel.stream_stream(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
            )
            call = reflection()
            await call.write(b"\x3a\x00")
            assert health.SERVICE_NAME.encode() in await call.read()
            await call.done_writing()
    finally:
        await server.stop(grace=0)
    assert seen == [
        "/grpc.health.v1.Health/Check",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    ]
