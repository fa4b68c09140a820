"""Retry what the server says to retry: an agent between replicas, a database outage.

A replicated server answers `UNAVAILABLE` with an `ErrorInfo` reason `AGENT_MOVING`
(the agent is between owners) or `STORE_UNAVAILABLE` (its database is away), and a
`RetryInfo` delay. `RetryUnavailable`, an interceptor `connect` installs, makes the
same unary call again after that delay (jittered, within the call's deadline): the
same request, so the same `request_id`, which the server accepts once. Any other
status, or a bare `UNAVAILABLE` (no reason: the server itself is unreachable), is the
caller's as before. Streams resume on their own (`agentloop.stream`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

RETRIED_REASONS = frozenset({"AGENT_MOVING", "STORE_UNAVAILABLE"})

DEFAULT_DELAY = 0.5
"""Seconds to wait when the server named no delay."""

MAX_DELAY = 5.0
MAX_ATTEMPTS = 50
"""A call without a deadline is given up after this many attempts."""

T = TypeVar("T")


def retry_delay(error: grpc.aio.AioRpcError) -> float | None:
    """The delay before retrying `error`'s call, or None when it is not to be retried."""
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    reason, delay = "", DEFAULT_DELAY
    for key, value in error.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        for packed in status_pb2.Status.FromString(value).details:
            if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                packed.Unpack(info)
                reason = info.reason
            elif packed.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                packed.Unpack(retry)
                delay = retry.retry_delay.ToNanoseconds() / 1e9
    return min(max(delay, 0.0), MAX_DELAY) if reason in RETRIED_REASONS else None


async def retried(call: Callable[[float | None], Awaitable[T]], seconds: float | None) -> T:
    """`call(remaining seconds)`, again after each retryable refusal, for `seconds` at most."""
    deadline = None if seconds is None else time.monotonic() + seconds
    for attempt in range(1, MAX_ATTEMPTS + 1):
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            return await call(remaining)
        except grpc.aio.AioRpcError as error:
            delay = retry_delay(error)
            if delay is None or attempt == MAX_ATTEMPTS:
                raise
            wait = delay * random.uniform(0.5, 1.0)  # jitter: many clients do not retry at once
            if deadline is not None and time.monotonic() + wait >= deadline:
                raise
            await asyncio.sleep(wait)
    raise AssertionError("unreachable: the last attempt returns or raises")


class RetryUnavailable(grpc.aio.UnaryUnaryClientInterceptor):
    """Retries unary calls refused with a retryable reason (see the module)."""

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        """The call, retried within its deadline; its response (or its last refusal)."""

        async def attempt(remaining: float | None) -> Any:
            call = await continuation(details._replace(timeout=remaining), request)
            return await call

        return await retried(attempt, details.timeout)
