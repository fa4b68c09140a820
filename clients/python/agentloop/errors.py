"""One exception family for every refused or failed call, with the server's details.

The server puts a `google.rpc.Status` in the `grpc-status-details-bin` trailer of every
refusal: an `ErrorInfo` (a stable `reason` such as `AGENT_NOT_FOUND`, domain
`agentloop.v1`, metadata) and, when one field is at fault, a `BadRequest` naming it.
The facade's verbs raise `AgentloopError` subclasses, one per status code, with those
details decoded:

    try:
        await client.send("nobody", "hi")
    except NotFound as error:
        print(error.reason, error.message)  # AGENT_NOT_FOUND agent 'nobody' not found

Each is still a `grpc.aio.AioRpcError` (`error.code()`, `error.details()`), so code
written against the raw stubs keeps catching them.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

R = TypeVar("R")

DETAILS_TRAILER = "grpc-status-details-bin"
"""The trailer that carries a serialized `google.rpc.Status`."""


@dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request: its path (`options.tools[0]`) and what is wrong."""

    field: str
    description: str


class AgentloopError(grpc.aio.AioRpcError):
    """A call the server refused or that failed, with its decoded details."""

    status: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    """The gRPC status code of this class (`code()` returns the call's own)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: dict[str, str] | None = None,
        field_violations: tuple[FieldViolation, ...] = (),
        retry_delay: float | None = None,
        initial_metadata: grpc.aio.Metadata | None = None,
        trailing_metadata: grpc.aio.Metadata | None = None,
        debug_error_string: str | None = None,
    ) -> None:
        super().__init__(
            code,
            initial_metadata or grpc.aio.Metadata(),
            trailing_metadata or grpc.aio.Metadata(),
            message,
            debug_error_string,
        )
        self.message = message
        """The status message (what went wrong, naming the field or the object)."""
        self.reason = reason
        """`ErrorInfo.reason`: a stable, machine-readable name ("" when none was sent)."""
        self.domain = domain
        """`ErrorInfo.domain`: who names the reason (`agentloop.v1`)."""
        self.metadata = dict(metadata or {})
        """`ErrorInfo.metadata`: facts about the refusal (an agent id, a limit...)."""
        self.field_violations = field_violations
        """`BadRequest.field_violations`: the fields at fault, if any."""
        self.retry_delay = retry_delay
        """`RetryInfo.retry_delay` in seconds, when the server says when to retry."""

    @property
    def field(self) -> str:
        """The first bad field's path ("" when no field was named)."""
        return self.field_violations[0].field if self.field_violations else ""

    def __str__(self) -> str:
        named = f" [{self.reason}]" if self.reason else ""
        return f"{self.code().name}{named}: {self.message}"


class Cancelled(AgentloopError):
    """CANCELLED: the call was cancelled (by this client, usually)."""

    status = grpc.StatusCode.CANCELLED


class Unknown(AgentloopError):
    """UNKNOWN: a failure without a status (the server never sends it on purpose)."""

    status = grpc.StatusCode.UNKNOWN


class InvalidArgument(AgentloopError):
    """INVALID_ARGUMENT: a field of the request is wrong (see `field_violations`)."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(AgentloopError):
    """DEADLINE_EXCEEDED: the call's deadline passed before it finished."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(AgentloopError):
    """NOT_FOUND: no such agent, session, approval or plugin."""

    status = grpc.StatusCode.NOT_FOUND


class AlreadyExists(AgentloopError):
    """ALREADY_EXISTS: the agent, session or plugin exists already."""

    status = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(AgentloopError):
    """PERMISSION_DENIED: the caller may not do this."""

    status = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(AgentloopError):
    """RESOURCE_EXHAUSTED: a limit was reached (the message names it)."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(AgentloopError):
    """FAILED_PRECONDITION: not now (a disposed agent, an approval already answered)."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(AgentloopError):
    """ABORTED: a conflicting write won (a fenced replica); retry."""

    status = grpc.StatusCode.ABORTED


class OutOfRange(AgentloopError):
    """OUT_OF_RANGE: a sequence number or page past the end."""

    status = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(AgentloopError):
    """UNIMPLEMENTED: the server does not serve this method."""

    status = grpc.StatusCode.UNIMPLEMENTED


class Internal(AgentloopError):
    """INTERNAL: the server failed; its log says why."""

    status = grpc.StatusCode.INTERNAL


class Unavailable(AgentloopError):
    """UNAVAILABLE: the server cannot answer now (down, stopping, an agent moving); retry."""

    status = grpc.StatusCode.UNAVAILABLE


class DataLoss(AgentloopError):
    """DATA_LOSS: stored data is unreadable."""

    status = grpc.StatusCode.DATA_LOSS


class Unauthenticated(AgentloopError):
    """UNAUTHENTICATED: no token, or a wrong one."""

    status = grpc.StatusCode.UNAUTHENTICATED


BY_CODE: dict[grpc.StatusCode, type[AgentloopError]] = {
    kind.status: kind
    for kind in (
        Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
        PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
        Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated,
    )
}  # fmt: skip
"""The exception class of each status code."""


def error_from(error: grpc.aio.AioRpcError) -> AgentloopError:
    """The typed exception of a failed call, its `google.rpc` details decoded."""
    if isinstance(error, AgentloopError):
        return error
    code = error.code()
    kind = BY_CODE.get(code, AgentloopError)
    trailing = error.trailing_metadata() or grpc.aio.Metadata()
    status = _status(trailing)
    reason, domain, metadata = "", "", {}
    violations: list[FieldViolation] = []
    retry_delay: float | None = None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations += [FieldViolation(v.field, v.description) for v in bad.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_delay = retry.retry_delay.ToNanoseconds() / 1e9
    message = status.message if status is not None and status.message else error.details()
    return kind(
        code,
        message or "",
        reason=reason,
        domain=domain,
        metadata=metadata,
        field_violations=tuple(violations),
        retry_delay=retry_delay,
        initial_metadata=error.initial_metadata() or grpc.aio.Metadata(),
        trailing_metadata=trailing,
        debug_error_string=error.debug_error_string(),
    )


def _status(trailing: grpc.aio.Metadata) -> status_pb2.Status | None:
    """The rich status of a trailer, if the server sent one that parses."""
    for key, value in trailing:
        if key == DETAILS_TRAILER and isinstance(value, bytes):
            try:
                return status_pb2.Status.FromString(value)
            except DecodeError:  # a garbled trailer: the plain status still stands
                return None
    return None


async def call(rpc: Awaitable[R]) -> R:
    """The answer of a call; its failure as a typed `AgentloopError`."""
    try:
        return await rpc
    except grpc.aio.AioRpcError as error:
        raise error_from(error) from None
