"""The connection to one plugin: `Describe`, and one long-lived `Handle` stream.

Calls are multiplexed on the stream by call id, so many agents and seams share it and
several calls can be in flight. One writer task owns the stream's writes; the reader
resolves each call's future when its result arrives. A dropped stream fails the calls
in flight (`disconnected`) and is reopened with exponential backoff; calls made while
the plugin is unavailable fail at once, so a FAIL_OPEN plugin that is down costs
nothing. Notifications wait in a bounded buffer, a share per subscription; one that
finds no room (or the plugin not READY) is dropped before it is even built, and the
next one queued carries the count. Those still buffered when the stream ends are
dropped and counted the same way. A plugin that lists the `call_batch` capability
gets the notifications made within `GATHER_SECONDS` of each other in one `CallBatch`
message, or with the next call if it comes first; others get them one by one.
Everything is written as bytes (`server.plugins.wire`): each call is encoded once.

A failure stays with its call: a call over the message size limit fails alone before
it is sent, and a message from the plugin that does not decode (or has no kind)
resets only this plugin's stream: the calls in flight fail as `malformed`, and the
stream is reopened like after a drop. No exception escapes the stream task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

import grpc

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import hook_service_pb2_grpc as hk_rpc
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import stream_pb2 as st
from server.kernel.abort import AbortSignal
from server.kernel.errors import Aborted
from server.plugins.calls import NoticeSlot, PluginCallFailed, PluginStats, error_text
from server.plugins.deadlines import DeadlineExpired, Deadlines
from server.plugins.description import describe_request
from server.plugins.wire import (
    BATCH_CAPABILITY,
    BATCH_OVERHEAD,
    HANDLE_METHOD,
    batch_entry,
    batch_request,
    call_request,
    cancel_request,
    model_stream_request,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest message sent to or accepted from a plugin (`pluginMaxMessageBytes`)."""
BACKOFF_START = 0.1
BACKOFF_MAX = 5.0
GATHER_SECONDS = 0.002
"""How long the first of a run of notifications waits for the others (batching plugins)."""


_COUNTING = frozenset(
    field.name
    for field in hk.HookCall.DESCRIPTOR.oneofs_by_name["payload"].fields
    if field.message_type is not None and "dropped" in field.message_type.fields_by_name
)
"""The notification payloads that carry a `dropped` count (observers'; not the payload
of a seam subscribed `observe_only`)."""


def carried(note: hk.HookCall) -> int:
    """The drops a queued notification carries (0 if its payload has no count)."""
    payload = note.WhichOneof("payload") or ""
    return int(getattr(note, payload).dropped) if payload in _COUNTING else 0


async def _nothing() -> None:
    return None


class PluginUnreachable(Exception):
    """`Describe` failed: the plugin cannot be reached or refused."""


def open_channel(
    address: str,
    root_certificates: bytes | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.aio.Channel:
    """A channel to `host:port`, or TLS for `tls://host:port`.

    TLS trusts the system's roots, or `root_certificates` (PEM) when given.
    """
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # No retry layer: `Handle` is one long stream the connection reopens itself
        # (with backoff), and `Describe` is retried the same way; the retry filter
        # only costs CPU on every message (about 4 % of a call, measured).
        ("grpc.enable_retries", 0),
    ]
    if address.startswith("tls://"):
        credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        return grpc.aio.secure_channel(address[len("tls://") :], credentials, options)
    return grpc.aio.insecure_channel(address, options)


class PluginConnection:
    """Implements `PluginCaller` over gRPC."""

    def __init__(
        self,
        address: str,
        token: str,
        stats: PluginStats,
        root_certificates: bytes | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.address = address
        self.stats = stats
        self.max_message_bytes = max_message_bytes
        self.channel = open_channel(address, root_certificates, max_message_bytes)
        self.stub = hk_rpc.HookServiceStub(self.channel)
        self._handle: grpc.aio.StreamStreamMultiCallable[bytes, hk.HandleResponse]
        self._handle = self.channel.stream_stream(
            HANDLE_METHOD,
            request_serializer=None,
            response_deserializer=hk.HandleResponse.FromString,
        )
        """`Handle`, written as bytes (see `server.plugins.wire`)."""
        self.batches = False
        """Whether the plugin takes `NotificationBatch`es (it said so in `Describe`)."""
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self.state: reg.PluginState.ValueType = reg.PLUGIN_STATE_CONNECTING
        self.on_state: Callable[[], None] = lambda: None
        """Called after every change of `state` (readiness watches it)."""
        self.on_reconnect: Callable[[], Awaitable[None]] = _nothing
        """Awaited before each reconnection; raising keeps the plugin down (retried)."""
        self.last_error = ""
        self._failure_kind = "disconnected"
        """How the calls in flight fail when the stream ends: disconnected or malformed."""
        self._pending: dict[str, asyncio.Future[hk.HookResult]] = {}
        self._streams: dict[str, asyncio.Queue[st.StreamChunk | BaseException]] = {}
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._notes: deque[tuple[hk.HookCall, NoticeSlot]] = deque()
        self._dropped = 0
        self._wake_writer = asyncio.Event()
        self._urgent = asyncio.Event()
        """Set by a cancel: the writer stops gathering notifications and sends it."""
        self._stream: grpc.aio.StreamStreamCall[bytes, hk.HandleResponse] | None = None
        self._deadlines = Deadlines()
        """The deadlines of the calls in flight (`server.plugins.deadlines`)."""
        self._write_lock = asyncio.Lock()
        """Writes never overlap: calls write directly, the writer task sends the rest."""
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def describe(self, seconds: float) -> hk.DescribeResponse:
        """Call `Describe`; raises `PluginUnreachable` with the status on failure."""
        try:
            description = await self.stub.Describe(
                describe_request(self.max_message_bytes), timeout=seconds, metadata=self.metadata
            )
        except grpc.aio.AioRpcError as error:
            raise PluginUnreachable(f"{error.code().name}: {error.details()}") from None
        self.batches = BATCH_CAPABILITY in description.capabilities
        return description

    def start(self) -> None:
        """Open the `Handle` stream in the background (and keep it open)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"plugin:{self.address}")

    async def wait_ready(self, seconds: float) -> bool:
        """Wait until the stream is open; False if it is not within `seconds`."""
        try:
            async with asyncio.timeout(seconds):
                await self._ready.wait()
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        """Close the stream and the channel; calls in flight fail."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._fail_pending("the plugin was unregistered")
        self._deadlines.close()
        await self.channel.close()

    # -- PluginCaller --------------------------------------------------------------------

    async def call(self, call: hk.HookCall, seconds: float, signal: AbortSignal) -> hk.HookResult:
        """Send a call and await its result within `seconds`."""
        if self.state != reg.PLUGIN_STATE_READY:
            raise PluginCallFailed("disconnected", f"the plugin is unavailable ({self.last_error})")
        request = self._sized(call)
        call_id = call.call_id
        future: asyncio.Future[hk.HookResult] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        self.stats.calls += 1
        started = time.perf_counter()
        # No timer and no task per call: the deadline is an entry of the connection's
        # heap, and an abort fails the future directly.
        deadline = self._deadlines.add(seconds, future)

        def aborted(reason: str) -> None:
            if not future.done():
                future.set_exception(Aborted(reason))

        unsubscribe = signal.on_abort(aborted)
        try:
            deadline.task = asyncio.current_task()  # cancelled if the deadline passes meanwhile
            try:
                await self._send_now(request)
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
                self._cancel(call_id, signal.reason)
            raise
        except Aborted as abort:
            self._cancel(call_id, abort.reason)
            raise
        finally:
            deadline.ended = True
            unsubscribe()
            self._pending.pop(call_id, None)
            self.stats.record(call, time.perf_counter() - started)

    def _timed_out(self, call_id: str, seconds: float) -> PluginCallFailed:
        self.stats.timeouts += 1
        self._cancel(call_id, "deadline exceeded")
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
        if self.state != reg.PLUGIN_STATE_READY:
            raise PluginCallFailed("disconnected", f"the plugin is unavailable ({self.last_error})")
        request = self._sized(call, messages)
        queue: asyncio.Queue[st.StreamChunk | BaseException] = asyncio.Queue()
        self._streams[call.call_id] = queue
        self.stats.calls += 1
        started = time.perf_counter()
        finished = False
        try:
            await self._send_now(request)
            while True:
                try:
                    async with asyncio.timeout(seconds):
                        item = await signal.race(queue.get())
                except TimeoutError:
                    self.stats.timeouts += 1
                    raise PluginCallFailed("timeout", f"no chunk within {seconds:g} s") from None
                if isinstance(item, BaseException):
                    raise item
                if item.HasField("finish"):
                    finished = True
                yield item
                if finished:
                    return
        except Aborted as aborted:
            self._cancel(call.call_id, aborted.reason)
            raise
        except asyncio.CancelledError:
            if signal.aborted:  # the turn's cancel scope cancelled us: tell the plugin why
                self._cancel(call.call_id, signal.reason)
            raise
        finally:
            self._streams.pop(call.call_id, None)
            if not finished:
                self._cancel(call.call_id, "the model call was closed")
            self.stats.record(call, time.perf_counter() - started)

    def admit(self, slot: NoticeSlot) -> bool:
        """Room for one more notification of `slot`; if none, it is counted dropped."""
        if self.state == reg.PLUGIN_STATE_READY and slot.queued < slot.limit:
            return True
        self._dropped += 1
        self.stats.dropped += 1
        return False

    def notify(self, call: hk.HookCall, slot: NoticeSlot) -> None:
        """Queue an admitted notification; it carries the drops since the last one."""
        payload = call.WhichOneof("payload") or ""
        if payload in _COUNTING:  # else the next observer notification carries the count
            getattr(call, payload).dropped, self._dropped = self._dropped, 0
        slot.queued += 1
        self._notes.append((call, slot))
        self._wake_writer.set()

    # -- the stream ----------------------------------------------------------------------

    def _set_state(self, state: reg.PluginState.ValueType) -> None:
        self.state = state
        self.on_state()

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
        if size > self.max_message_bytes:
            self.stats.calls += 1
            self.stats.oversized += 1
            raise PluginCallFailed(
                "oversized",
                f"the call is {size} bytes, over the {self.max_message_bytes}-byte message limit",
            )
        return request

    def _violation(self, problem: str) -> None:
        """The plugin broke the protocol: its stream is reset, its calls fail as malformed."""
        self.stats.protocol_errors += 1
        self._failure_kind = "malformed"
        self.last_error = f"protocol violation: {problem}"

    def _cancel(self, call_id: str, reason: str) -> None:
        if self.state == reg.PLUGIN_STATE_READY:
            self._outbox.put_nowait(cancel_request(call_id, reason))
            self._wake_writer.set()
            self._urgent.set()

    async def _run(self) -> None:
        backoff = BACKOFF_START
        connected_before = False
        while not self._closed:
            if connected_before:
                try:  # the plugin may have restarted as another version: Describe again
                    await self.on_reconnect()
                except Exception as error:
                    self.last_error = f"Describe on reconnect failed: {error}"
                    self._set_state(reg.PLUGIN_STATE_UNAVAILABLE)
                    log.warning("plugin at %s: %s", self.address, self.last_error)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    self._set_state(reg.PLUGIN_STATE_CONNECTING)
                    continue
            stream = self._handle(metadata=self.metadata)
            writer: asyncio.Task[None] | None = None
            try:
                await stream.wait_for_connection()
                self._stream = stream
                self._set_state(reg.PLUGIN_STATE_READY)
                self._ready.set()
                if connected_before:
                    self.stats.reconnects += 1
                connected_before, backoff = True, BACKOFF_START
                writer = asyncio.create_task(self._write(stream))
                while True:
                    response = await stream.read()
                    if response is grpc.aio.EOF:
                        self.last_error = "the plugin closed the stream"
                        break
                    if not isinstance(response, hk.HandleResponse):
                        self._violation("a message that does not decode as a HandleResponse")
                        break
                    kind = response.WhichOneof("kind")
                    if kind == "chunk":
                        self._deliver(response.chunk)
                    elif kind == "result":
                        self._resolve(response.result)
                    else:
                        self._violation("a HandleResponse with no kind set")
                        break
            except grpc.aio.AioRpcError as error:
                self.last_error = f"{error.code().name}: {error.details()}"
            except asyncio.CancelledError:
                stream.cancel()
                raise
            except Exception as error:  # a bug must not end the task: the plugin would wedge
                log.exception("plugin at %s: the stream failed", self.address)
                self.last_error = f"the stream failed: {error!r}"
            finally:
                if writer is not None:
                    writer.cancel()
                    await asyncio.wait([writer])  # it ends before the stream is dropped
            stream.cancel()
            self._stream = None
            self._set_state(reg.PLUGIN_STATE_UNAVAILABLE)
            self._ready.clear()
            self._fail_pending(self.last_error, self._failure_kind)
            self._failure_kind = "disconnected"
            log.warning("plugin at %s unavailable: %s", self.address, self.last_error)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
            self._set_state(reg.PLUGIN_STATE_CONNECTING)

    async def _send_now(self, request: bytes) -> None:
        """Write a call at once (no hop through the writer task).

        Notifications waiting to be sent go with it, before it, in one batch (to a
        plugin that takes batches): one message instead of two.
        """
        stream = self._stream
        if stream is None:
            raise PluginCallFailed("disconnected", f"the plugin is unavailable ({self.last_error})")
        try:
            async with self._write_lock:
                if self.batches and self._notes:  # the request is also a batch entry
                    notes = self._take_notes(self.max_message_bytes - len(request))
                    if notes:
                        request = batch_request([*notes, request])
                await stream.write(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as error:
            raise PluginCallFailed("disconnected", f"the stream broke: {error}") from None

    async def _write(self, stream: grpc.aio.StreamStreamCall[bytes, hk.HandleResponse]) -> None:
        """Send what is not time-critical: cancels first, then notifications.

        To a plugin that takes batches, notifications wait `GATHER_SECONDS` after the
        first, so that those made meanwhile go with it (or with a call made meanwhile).
        """
        gathered = False
        while True:
            if not self._outbox.empty():
                async with self._write_lock:
                    await stream.write(self._outbox.get_nowait())
                continue
            if self._notes:
                if self.batches and not gathered:
                    gathered = True
                    self._urgent.clear()  # a cancel cuts the wait short
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(GATHER_SECONDS):
                            await self._urgent.wait()
                    continue
                gathered = False
                request = self._next_notes()
                if request is not None:
                    async with self._write_lock:
                        await stream.write(request)
                continue
            gathered = False
            self._wake_writer.clear()
            if self._outbox.empty() and not self._notes:
                await self._wake_writer.wait()

    def _next_notes(self) -> bytes | None:
        """The next message of notifications: one, or a batch of all that fit; None if none."""
        entries = self._take_notes(self.max_message_bytes, 1 << 30 if self.batches else 1)
        if len(entries) > 1:
            return batch_request(entries)
        return entries[0] if entries else None  # alone: the single form, the same bytes

    def _take_notes(self, room: int, most: int = 1 << 30) -> list[bytes]:
        """Batch entries of the oldest queued notifications that fit in `room` bytes.

        A notification too big to send alone is dropped and counted.
        """
        entries: list[bytes] = []
        size = BATCH_OVERHEAD
        notes = self._notes
        while notes and len(entries) < most:
            note, slot = notes[0]
            entry = batch_entry(note.SerializeToString())
            if len(entry) > self.max_message_bytes:
                notes.popleft()
                slot.queued -= 1
                self._dropped += carried(note) + 1  # too big to send: dropped, counted
                self.stats.dropped += 1
                self.stats.oversized += 1
                continue
            if entries and size + len(entry) > room:
                break  # the rest goes in the next message
            notes.popleft()
            slot.queued -= 1
            entries.append(entry)
            size += len(entry)
        return entries

    def _deliver(self, chunk: hk.ModelChunk) -> None:
        queue = self._streams.get(chunk.call_id)
        if queue is not None:
            queue.put_nowait(chunk.chunk)
        else:
            self._unexpected(chunk.call_id, "a chunk")

    def _resolve(self, result: hk.HookResult) -> None:
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
        self.stats.unexpected_results += 1
        log.warning(
            "plugin at %s sent %s for call %r, which is not in flight (unknown, answered,"
            " cancelled or past its deadline); ignored",
            self.address, what, call_id,
        )  # fmt: skip

    def _fail_pending(self, reason: str, kind: str = "disconnected") -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(PluginCallFailed(kind, reason))
        for queue in self._streams.values():
            queue.put_nowait(PluginCallFailed(kind, reason))
        while not self._outbox.empty():
            self._outbox.get_nowait()
        # Buffered notifications die with the stream: counted, and carried by the next one.
        for note, slot in self._notes:
            slot.queued -= 1
            self._dropped += carried(note) + 1
            self.stats.dropped += 1
        self._notes.clear()
