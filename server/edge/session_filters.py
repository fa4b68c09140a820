"""The filters of `ListSessions`, read from its request and checked field by field."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from agentloop.v1 import agent_service_pb2 as pb
from server.kernel.errors import InvalidArgument
from server.kernel.ids import check_id
from server.sessions.listing import END_REASONS, SessionFilter

MAX_ID_TEXT = 128
"""The longest `id_contains`: as long as an id."""

LAST_SECOND = 253_402_300_799
"""9999-12-31T23:59:59Z: the last second a protobuf Timestamp may hold."""


def session_filter(request: pb.ListSessionsRequest) -> SessionFilter:
    """The filter a `ListSessionsRequest` asks for; INVALID_ARGUMENT names a bad field."""
    if request.agent_id:
        check_id("agent_id", request.agent_id)
    if request.end_reason and request.end_reason not in END_REASONS:
        words = ", ".join(sorted(END_REASONS))
        raise InvalidArgument("end_reason", f"must be one of {words}")
    if len(request.id_contains) > MAX_ID_TEXT:
        raise InvalidArgument("id_contains", f"must be at most {MAX_ID_TEXT} characters")
    after = _nanos("created_after", request.created_after, request.HasField("created_after"))
    before = _nanos("created_before", request.created_before, request.HasField("created_before"))
    if after is not None and before is not None and before <= after:
        raise InvalidArgument("created_before", "must be later than created_after")
    return SessionFilter(
        agent_id=request.agent_id,
        live=request.live if request.HasField("live") else None,
        created_after_ns=after,
        created_before_ns=before,
        end_reason=request.end_reason,
        id_contains=request.id_contains,
    )


def _nanos(name: str, stamp: timestamp_pb2.Timestamp, present: bool) -> int | None:
    if not present:
        return None
    if not (0 <= stamp.nanos < 1_000_000_000 and 0 <= stamp.seconds <= LAST_SECOND):
        raise InvalidArgument(name, "must be a valid time from 1970 to 9999")
    nanos: int = stamp.ToNanoseconds()
    return nanos
