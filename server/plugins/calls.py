"""Calls to a plugin: the transport's contract, the failure kinds, stats, and the contract's views.

The gRPC edge implements `PluginCaller` over the plugin's `Handle` stream; the remote
listeners, tools and models here call through it. Nothing in this module is per seam.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf import unknown_fields

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.kernel.abort import AbortSignal
from server.kernel.defaults import PLUGIN_TIMEOUT_SECONDS
from server.kernel.tools import ToolExecution, ToolOutcome
from server.observability.observe import PLUGIN_CALL_BUCKETS

DEFAULT_TIMEOUT = PLUGIN_TIMEOUT_SECONDS
"""Seconds a call waits for its result when neither the plugin nor the operator set it."""


class PluginCallFailed(Exception):
    """A call to a plugin failed: timeout, error, malformed, oversized or disconnected."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class PluginCaller(Protocol):
    """The transport to one plugin."""

    async def call(self, call: hk.HookCall, seconds: float, signal: AbortSignal) -> hk.HookResult:
        """Send a call, await its result for `seconds`; raises `PluginCallFailed` or `Aborted`."""
        ...

    def stream(
        self,
        call: hk.HookCall,
        seconds: float,
        signal: AbortSignal,
        messages: Sequence[bytes | bytearray] | None = None,
    ) -> AsyncGenerator[st.StreamChunk, None]:
        """Send a `model_stream` call; yield its chunks (`seconds` bounds each wait).

        `messages`, when given, are the model stream's messages, encoded
        (`wire.message_entry`): the call itself holds none.
        """
        ...

    def admit(self, slot: NoticeSlot) -> bool:
        """Whether a notification of `slot` would be queued now; if not, count it dropped.

        Asked before the notification is built, so that a dropped one costs nothing.
        """
        ...

    def notify(self, call: hk.HookCall, slot: NoticeSlot) -> None:
        """Queue an admitted notification (no result); never blocks."""
        ...

    def offer_event(self, head: bytes, event: ev.SessionEvent, slot: NoticeSlot) -> None:
        """`admit` and `notify` in one, for a session-event notification; never blocks.

        `head` is `event_notes.event_head`; the two are encoded as one call
        (`event_notes.event_entry`).
        """
        ...

    def offer_events(
        self, head: bytes, events: Sequence[ev.SessionEvent], slot: NoticeSlot
    ) -> None:
        """`offer_event` each of `events` in turn, in one call."""
        ...


NOTIFICATION_BUFFER = 1024
"""Notifications a subscription may have waiting to be sent, unless it sets its own."""


@dataclass(eq=False)
class NoticeSlot:
    """One observer subscription's share of the plugin's notification buffer.

    Hashed and compared by identity: each is its own subscription's.
    """

    limit: int = NOTIFICATION_BUFFER
    queued: int = 0


@dataclass
class PluginStats:
    """Counters and latency samples of one plugin."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    fail_opens: int = 0
    dropped: int = 0
    reconnects: int = 0
    oversized: int = 0
    protocol_errors: int = 0
    unexpected_results: int = 0
    latencies: dict[tuple[int, int], deque[float]] = field(default_factory=dict)
    """Per (call kind, contract seam), the latest call latencies in seconds."""
    histograms: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    """Per (call kind, contract seam), every call since the start: the count of each
    `PLUGIN_CALL_BUCKETS` bucket (not cumulative, +Inf last), then the sum of the seconds."""
    skipped: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    """Per contract seam, the calls its match conditions skipped (`+= 1`: no call made)."""

    def record(self, call: hk.HookCall, seconds: float) -> None:
        """Keep one latency sample of `call` (the latest 1000 per kind and seam), and count it."""
        key = (call.kind, call.seam)
        samples = self.latencies.get(key)
        if samples is None:
            samples = self.latencies[key] = deque(maxlen=1000)
            self.histograms[key] = [0.0] * (len(PLUGIN_CALL_BUCKETS) + 2)
        samples.append(seconds)
        counts = self.histograms[key]
        counts[bisect.bisect_left(PLUGIN_CALL_BUCKETS, seconds)] += 1
        counts[-1] += seconds


class CallIds:
    """Numbers of the call ids this server makes (prefixed per kind of call).

    `next` takes one; `take` a run of them at once, as many as a run of notifications
    needs, without making a number for each.
    """

    __slots__ = ("_next",)

    def __init__(self, first: int = 1) -> None:
        self._next = first

    def __iter__(self) -> CallIds:
        return self

    def __next__(self) -> int:
        number = self._next
        self._next = number + 1
        return number

    def take(self, count: int) -> int:
        """Reserve the next `count` numbers; returns the first."""
        first = self._next
        self._next = first + count
        return first


call_ids = CallIds()
"""The numbers of every call id of this process."""


def error_text(error: hk.CallError) -> str:
    """A plugin's error as the turn's error message shows it."""
    code = error.code or 2
    try:
        name = grpc_code_names[code]
    except KeyError:
        name = f"code {code}"
    return f"{name}: {error.message}" if error.message else name


grpc_code_names = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}  # fmt: skip
"""`google.rpc.Code` names by number (the core imports no grpc)."""


def checked(result: hk.HookResult, expected: str) -> str | None:
    """The outcome kind of a call's result: None ("continue unchanged") or `expected`.

    Raises:
        PluginCallFailed: an `error` outcome ("error"), or a decision of another kind or
            fields this server does not know ("malformed").
    """
    kind = result.WhichOneof("outcome")
    if kind == "error":
        raise PluginCallFailed("error", error_text(result.error))
    check_known(result)
    if kind is not None and kind != expected:
        raise PluginCallFailed("malformed", f"answered {kind} to a {expected} call")
    return kind


def check_known(result: hk.HookResult) -> None:
    """Refuse a result carrying fields this server does not know.

    A decision of a kind from a newer protocol would otherwise read as "continue
    unchanged": on a policy seam, a silent fail-open.
    """
    unknown = unknown_fields.UnknownFieldSet(result)
    if len(unknown):
        numbers = sorted({unknown[i].field_number for i in range(len(unknown))})
        raise PluginCallFailed(
            "malformed", f"the result holds fields this server does not know: {numbers}"
        )


def invocation(exec: ToolExecution) -> hk.ToolInvocation:
    """The contract's view of a tool call."""
    return hk.ToolInvocation(call_id=exec.call_id, name=exec.name, arguments=exec.raw_arguments)


def tool_output(outcome: ToolOutcome) -> hk.ToolOutput:
    """The contract's view of a tool result."""
    output = hk.ToolOutput(
        content=outcome.content,
        is_error=outcome.is_error,
        error=outcome.error,
        additional_contexts=outcome.contexts,
    )
    if outcome.meta is not None:
        output.meta.update(outcome.meta)  # type: ignore[arg-type]
    return output
