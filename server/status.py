"""The one mapping from domain errors to gRPC status codes."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from server.errors import (
    AgentLoopError,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    ResourceExhausted,
    SessionDamaged,
)
from server.stores import StoreConflict, StoreUnavailable

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
]

Response = TypeVar("Response")
Method = Callable[..., Awaitable[Response]]


def code_of(error: AgentLoopError) -> grpc.StatusCode:
    """The status code of a domain error."""
    for kind, code in CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


def mapped(method: Method[Response]) -> Method[Response]:
    """Turn the domain errors a unary servicer method raises into statuses."""

    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Response:
        try:
            return await method(self, request, context)
        except AgentLoopError as error:
            await context.abort(code_of(error), str(error))
            raise  # unreachable: abort raises

    return wrapper
