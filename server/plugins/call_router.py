"""The calls in flight on one plugin's `Handle` stream, routed by call id.

A call waits on a future of its own, a model stream on a queue of its own; the stream's
reader hands each answer to `resolve` or `deliver`, which finds its call by id (an
answer to no call in flight is counted and ignored). A call's deadline is an entry of
the router's heap (`agentloop.plugin.transport.Deadlines`): no timer and no task per
call. A call that ends early (deadline, abort, a model stream closed before its finish)
tells the plugin with a `CancelCall`. The stream itself, its state and its writes are
the connection's (`server.plugins.connection`), reached through `Link`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

from agentloop.plugin.transport import Deadline, DeadlineExpired, Deadlines
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import stream_pb2 as st
from server.kernel.abort import AbortSignal
from server.kernel.errors import Aborted
from server.plugins.calls import PluginCallFailed, PluginStats, error_text
from server.plugins.wire import call_request, model_stream_request

log = logging.getLogger(__name__)


class Link(Protocol):
    """The stream the calls go over."""

    def check_ready(self) -> None:
        """Raise `PluginCallFailed` ("disconnected") unless the stream is open."""
        ...

    async def send_now(self, request: bytes) -> None:
        """Write `request` at once; raises `PluginCallFailed` if the stream broke."""
        ...

    def cancel(self, call_id: str, reason: str) -> None:
        """Tell the plugin a call was withdrawn (if the stream is open)."""
        ...


class CallDeadline(Deadline):
    """A call's deadline on the server's side (see `expire`)."""

    __slots__ = ("future", "task")

    def __init__(self, future: asyncio.Future[Any]) -> None:
        super().__init__()
        self.future = future
        self.task: asyncio.Task[Any] | None = None
        """Set while the call writes its request: cancelled if the deadline passes then."""

    def expire(self) -> None:
        """Cancel the call, or fail its wait for the result with `DeadlineExpired`.

        Cancelled if it is still writing its request (the write may wait on flow control).
        """
        self.expired = True
        if self.task is not None:
            self.task.cancel()
        elif not self.future.done():
            self.future.set_exception(DeadlineExpired())


class CallRouter:
    """Futures, model-stream queues and deadlines of the calls in flight, by call id."""

    def __init__(
        self, link: Link, stats: PluginStats, max_message_bytes: int, address: str
    ) -> None:
        self._link = link
        self._stats = stats
        self._max_message_bytes = max_message_bytes
        self._address = address
        self._pending: dict[str, asyncio.Future[hk.HookResult]] = {}
        self._streams: dict[str, asyncio.Queue[st.StreamChunk | BaseException]] = {}
        self._deadlines = Deadlines()

    async def call(self, call: hk.HookCall, seconds: float, signal: AbortSignal) -> hk.HookResult:
        """Send a call and await its result within `seconds`."""
        self._link.check_ready()
        request = self._sized(call)
        call_id = call.call_id
        future: asyncio.Future[hk.HookResult] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        self._stats.calls += 1
        started = time.perf_counter()
        deadline = self._deadlines.add(CallDeadline(future), seconds)

        def aborted(reason: str) -> None:  # an abort fails the future directly: no task
            if not future.done():
                future.set_exception(Aborted(reason))

        unsubscribe = signal.on_abort(aborted)
        try:
            deadline.task = asyncio.current_task()  # cancelled if the deadline passes meanwhile
            try:
                await self._link.send_now(request)
            finally:
                deadline.task = None
            return await future
        except DeadlineExpired:
            raise self._timed_out(call_id, seconds) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if deadline.expired and task is not None and task.uncancel() == 0:
                raise self._timed_out(call_id, seconds) from None  # during the write
            if signal.aborted:  # the turn's cancel scope cancelled us: tell the plugin why
                self._link.cancel(call_id, signal.reason)
            raise
        except Aborted as abort:
            self._link.cancel(call_id, abort.reason)
            raise
        finally:
            deadline.ended = True
            unsubscribe()
            self._pending.pop(call_id, None)
            self._stats.record(call, time.perf_counter() - started)

    def _timed_out(self, call_id: str, seconds: float) -> PluginCallFailed:
        self._stats.timeouts += 1
        self._link.cancel(call_id, "deadline exceeded")
        return PluginCallFailed("timeout", f"no answer within {seconds:g} s")

    async def stream(
        self,
        call: hk.HookCall,
        seconds: float,
        signal: AbortSignal,
        messages: Sequence[bytes | bytearray] | None = None,
    ) -> AsyncGenerator[st.StreamChunk, None]:
        """Send a `model_stream` call and yield its chunks until the finish.

        `seconds` bounds the silence between two chunks, not the whole call. `messages`,
        when given, are the model stream's messages, encoded: the call holds none.
        """
        self._link.check_ready()
        request = self._sized(call, messages)
        queue: asyncio.Queue[st.StreamChunk | BaseException] = asyncio.Queue()
        self._streams[call.call_id] = queue
        self._stats.calls += 1
        started = time.perf_counter()
        finished = False
        try:
            await self._link.send_now(request)
            while True:
                try:
                    async with asyncio.timeout(seconds):
                        item = await signal.race(queue.get())
                except TimeoutError:
                    self._stats.timeouts += 1
                    raise PluginCallFailed("timeout", f"no chunk within {seconds:g} s") from None
                if isinstance(item, BaseException):
                    raise item
                if item.HasField("finish"):
                    finished = True
                yield item
                if finished:
                    return
        except Aborted as aborted:
            self._link.cancel(call.call_id, aborted.reason)
            raise
        except asyncio.CancelledError:
            if signal.aborted:  # the turn's cancel scope cancelled us: tell the plugin why
                self._link.cancel(call.call_id, signal.reason)
            raise
        finally:
            self._streams.pop(call.call_id, None)
            if not finished:
                self._link.cancel(call.call_id, "the model call was closed")
            self._stats.record(call, time.perf_counter() - started)

    def _sized(
        self, call: hk.HookCall, messages: Sequence[bytes | bytearray] | None = None
    ) -> bytes:
        """The request of `call`, encoded; a call over the size limit fails here, alone.

        `messages`: a model stream's messages, encoded apart (`model_stream_request`).
        """
        if messages is None:
            request = call_request(call.SerializeToString())
        else:
            request = model_stream_request(call, messages)
        size = len(request)
        if size > self._max_message_bytes:
            self._stats.calls += 1
            self._stats.oversized += 1
            raise PluginCallFailed(
                "oversized",
                f"the call is {size} bytes, over the {self._max_message_bytes}-byte message limit",
            )
        return request

    # -- answers, from the stream's reader ----------------------------------------------

    def deliver(self, chunk: hk.ModelChunk) -> None:
        """A chunk of a model stream: to its queue."""
        queue = self._streams.get(chunk.call_id)
        if queue is not None:
            queue.put_nowait(chunk.chunk)
        else:
            self._unexpected(chunk.call_id, "a chunk")

    def resolve(self, result: hk.HookResult) -> None:
        """A call's result: to its future (or it ends a model stream)."""
        queue = self._streams.get(result.call_id)
        if queue is not None:  # a result ends a model stream: an error, or a finish-less end
            why = (
                error_text(result.error)
                if result.HasField("error")
                else "the model call ended without a finish chunk"
            )
            queue.put_nowait(PluginCallFailed("error", why))
            return
        future = self._pending.get(result.call_id)
        if future is not None and not future.done():
            future.set_result(result)
        else:
            self._unexpected(result.call_id, "a result")

    def _unexpected(self, call_id: str, what: str) -> None:
        """An answer to no call in flight: unknown id, a second answer, or after a cancel."""
        self._stats.unexpected_results += 1
        log.warning(
            "plugin at %s sent %s for call %r, which is not in flight (unknown, answered,"
            " cancelled or past its deadline); ignored",
            self._address, what, call_id,
        )  # fmt: skip

    def fail_all(self, reason: str, kind: str = "disconnected") -> None:
        """Fail every call in flight (the stream ended): `kind` is their failure's kind."""
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(PluginCallFailed(kind, reason))
        for queue in self._streams.values():
            queue.put_nowait(PluginCallFailed(kind, reason))

    def close(self) -> None:
        """Forget the deadlines (the connection is closed)."""
        self._deadlines.close()
