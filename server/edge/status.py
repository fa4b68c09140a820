"""The one mapping from domain errors to gRPC statuses, with AIP-193 details.

Every refusal carries, in the `grpc-status-details-bin` trailer, a `google.rpc.Status`
whose details hold an `ErrorInfo` (a reason from the documented list in
`proto/README.md`, the domain, and the ids the error is about) and, for a bad field, a
`BadRequest` naming it: a client in any language reads them without parsing text.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2

# googleapis-common-protos ships .pyi files but no py.typed marker.
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from server.kernel.errors import (
    AgentLoopError,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    ResourceExhausted,
    SessionDamaged,
    Unavailable,
)
from server.stores import StoreConflict, StoreUnavailable

DOMAIN = "agentloop.v1"
"""The `ErrorInfo.domain` of every error this server reports."""

CODES: list[tuple[type[AgentLoopError], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (SessionDamaged, grpc.StatusCode.DATA_LOSS),
    (StoreConflict, grpc.StatusCode.ABORTED),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
]

Response = TypeVar("Response")
Method = Callable[..., Awaitable[Response]]
Context = grpc.aio.ServicerContext[Any, Any]


def code_of(error: AgentLoopError) -> grpc.StatusCode:
    """The status code of a domain error."""
    for kind, code in CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _packed(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def rich_status(
    code: grpc.StatusCode,
    message: str,
    reason: str,
    metadata: dict[str, str] | None = None,
    field: str = "",
    problem: str = "",
) -> status_pb2.Status:
    """A `google.rpc.Status` with an `ErrorInfo`, and a `BadRequest` when a field is named."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata or {})
    details = [_packed(info)]
    if field:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=field, description=problem or message, reason=reason
        )
        details.append(_packed(error_details_pb2.BadRequest(field_violations=[violation])))
    return status_pb2.Status(code=code.value[0], message=message, details=details)


def status_of(error: AgentLoopError) -> status_pb2.Status:
    """The rich status of a domain error."""
    field, problem = "", ""
    if isinstance(error, InvalidArgument):
        field, problem = error.field, error.problem
    return rich_status(code_of(error), str(error), error.reason, error.metadata, field, problem)


async def abort_with(context: Context, status: status_pb2.Status) -> NoReturn:
    """End the call with `status`, its details in the standard trailer."""
    converted = rpc_status.to_status(status)
    await context.abort(converted.code, converted.details, converted.trailing_metadata)
    raise AssertionError("unreachable: abort raises")


async def abort(context: Context, error: AgentLoopError) -> NoReturn:
    """End the call with the status of a domain error."""
    await abort_with(context, status_of(error))


def mapped(method: Method[Response]) -> Method[Response]:
    """Turn the domain errors a unary servicer method raises into statuses."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Context) -> Response:
        try:
            return await method(self, request, context)
        except AgentLoopError as error:
            await abort(context, error)

    return wrapper
