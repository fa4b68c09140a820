"""Every integer field of every request, at its extremes: a precise status, never UNKNOWN.

Walks the request descriptors of the services (nested messages too) and, for each
integer field, calls a real server on a SQLite file with that field at the extremes of
its wire type (0, -1, the type's minimum and maximum, 2^63) while the ids name a live
agent and its session. Each answer is OK or a documented refusal (`INVALID_ARGUMENT`
naming that field, `OUT_OF_RANGE`, `NOT_FOUND`, `FAILED_PRECONDITION`,
`ALREADY_EXISTS`), never `UNKNOWN` or `INTERNAL`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2
from server.settings.config import Config
from tests.e2e.conftest import running_app
from tests.e2e.test_contract import details

F = FieldDescriptor
EXTREMES = {
    F.TYPE_INT32: (0, -1, -(2**31), 2**31 - 1),
    F.TYPE_SINT32: (0, -1, -(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (0, -1, -(2**31), 2**31 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_INT64: (0, -1, -(2**63), 2**63 - 1),
    F.TYPE_SINT64: (0, -1, -(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (0, -1, -(2**63), 2**63 - 1),
    F.TYPE_UINT64: (0, 2**63 - 1, 2**63, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**63 - 1, 2**63, 2**64 - 1),
}
"""Per wire type, the values each field is tried with."""

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # a long WaitIdle: the client's own deadline
}

SKIPPED = {"StreamSessionEvents", "DisposeAgent"}
"""A stream (tried by its own test) and a call that would end the live agent."""


def integer_fields(descriptor: Any, depth: int = 0) -> Iterator[tuple[list[str], Any]]:
    """(path of field names, field) of each integer field, nested messages included."""
    for field in descriptor.fields:
        if field.type in EXTREMES:
            yield [field.name], field
        elif (
            field.type == F.TYPE_MESSAGE
            and depth < 3
            and not field.message_type.GetOptions().map_entry
        ):
            if field.message_type.full_name.startswith("google.protobuf.Struct"):
                continue
            for path, inner in integer_fields(field.message_type, depth + 1):
                yield [field.name, *path], inner


def with_value(request: Message, path: list[str], field: Any, value: int) -> None:
    target = request
    for name in path[:-1]:
        inner = getattr(target, name)
        if target.DESCRIPTOR.fields_by_name[name].is_repeated:
            inner = inner.add()
        target = inner
    if field.is_repeated:
        getattr(target, path[-1]).append(value)
    else:
        setattr(target, path[-1], value)


async def test_integer_fields_at_their_extremes_get_a_precise_status(tmp_path: Path) -> None:
    config = Config(listen="127.0.0.1:0", store="sqlite", data_dir=str(tmp_path), agents=())
    async with running_app(config) as server:
        created = await server.factory.CreateAgent(fac.CreateAgentRequest(agent_id="a"), timeout=5)
        ids = {"agent_id": "a", "session_id": created.agent.session_id}
        tried = 0
        for module in (agent_service_pb2, fac):
            for service in module.DESCRIPTOR.services_by_name.values():
                for method in service.methods:
                    if method.name in SKIPPED or method.server_streaming:
                        continue
                    request_class = GetMessageClass(method.input_type)
                    response_class = GetMessageClass(method.output_type)
                    call = server.channel.unary_unary(
                        f"/{service.full_name}/{method.name}",
                        request_serializer=request_class.SerializeToString,
                        response_deserializer=response_class.FromString,
                    )
                    for path, field in integer_fields(method.input_type):
                        for value in EXTREMES[field.type]:
                            request: Any = request_class()
                            for name, value_id in ids.items():
                                if name in method.input_type.fields_by_name:
                                    setattr(request, name, value_id)
                            if "agent_id" in method.input_type.fields_by_name and method.name in {
                                "CreateAgent",
                                "ResumeAgent",
                            }:
                                request.agent_id = f"n{tried}"
                            with_value(request, path, field, value)
                            where = f"{method.name} {'.'.join(path)}={value}"
                            code = grpc.StatusCode.OK
                            try:
                                await call(request, timeout=2)
                            except grpc.aio.AioRpcError as error:
                                code = error.code()
                                assert code in ALLOWED, (where, code, error.details())
                                if code == grpc.StatusCode.INVALID_ARGUMENT:
                                    info, bad = details(error)
                                    assert bad is not None, (where, error.details())
                            tried += 1
                            with contextlib.suppress(grpc.aio.AioRpcError):  # ends a test agent
                                if (
                                    method.name in {"CreateAgent", "ResumeAgent"}
                                    and code == grpc.StatusCode.OK
                                ):
                                    await server.factory.DisposeAgent(
                                        fac.DisposeAgentRequest(agent_id=request.agent_id),
                                        timeout=5,
                                    )
        assert tried > 40, tried


async def test_a_seq_past_the_signed_range_is_invalid_and_names_its_field(tmp_path: Path) -> None:
    config = Config(listen="127.0.0.1:0", store="sqlite", data_dir=str(tmp_path), agents=())
    async with running_app(config) as server:
        created = await server.factory.CreateAgent(fac.CreateAgentRequest(agent_id="a"), timeout=5)
        session_id = created.agent.session_id
        for request, field in (
            (agent_service_pb2.ForkSessionRequest(session_id=session_id, boundary_seq=2**63),
             "boundary_seq"),
            (agent_service_pb2.ListSessionEventsRequest(session_id=session_id, from_seq=2**64 - 1),
             "from_seq"),
        ):  # fmt: skip
            method = type(request).__name__.removesuffix("Request")
            call = getattr(server.agents, method)
            try:
                await call(request, timeout=5)
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
                info, bad = details(error)
                assert info.reason == "INVALID_FIELD"
                assert [v.field for v in bad.field_violations] == [field]
            else:
                raise AssertionError(f"{method} accepted {field} past 2^63 - 1")
