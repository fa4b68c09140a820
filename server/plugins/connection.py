"""The connection to one plugin: its channel, `Describe`, and one long-lived `Handle` stream.

It owns the stream's life: opens it, reads it, and when it drops fails the calls in
flight (`disconnected`) and reopens it with exponential backoff, Describing the plugin
again first. Calls made while the plugin is not READY fail at once, so a FAIL_OPEN
plugin that is down costs nothing. `PluginCaller` is implemented with two parts: the
calls in flight by id (`server.plugins.call_router`), and the cancels and notifications
waiting to be written (`server.plugins.notice_queue`). Everything is written as bytes
(`server.plugins.wire`); writes never overlap: a call writes itself at once, the
writer task sends the rest.

A failure stays with its call: a call over the message size limit fails alone before
it is sent, and a message from the plugin that does not decode (or has no kind)
resets only this plugin's stream: the calls in flight fail as `malformed`, and the
stream is reopened like after a drop. No exception escapes the stream task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from typing import Any

import grpc

from agentloop.plugin.transport import MAX_MESSAGE_BYTES
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import hook_service_pb2_grpc as hk_rpc
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.kernel.abort import AbortSignal
from server.plugins.call_router import CallRouter
from server.plugins.calls import NoticeSlot, PluginCallFailed, PluginStats
from server.plugins.description import describe_request
from server.plugins.notice_queue import NoticeQueue
from server.plugins.wire import BATCH_CAPABILITY, HANDLE_METHOD, cancel_request

log = logging.getLogger(__name__)

BACKOFF_START = 0.1
BACKOFF_MAX = 5.0

Stream = grpc.aio.StreamStreamCall[bytes, hk.HandleResponse]


async def _nothing() -> None:
    return None


class PluginUnreachable(Exception):
    """`Describe` failed: the plugin cannot be reached or refused."""


def open_channel(
    address: str, root_certificates: bytes | None = None, max_message_bytes: int = MAX_MESSAGE_BYTES
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
        max_message_bytes: int = MAX_MESSAGE_BYTES,
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
        self._router = CallRouter(self, stats, max_message_bytes, address)
        self._notices = NoticeQueue(stats, max_message_bytes)
        self.notify: Callable[[hk.HookCall, NoticeSlot], None] = self._notices.notify
        """Queue an admitted notification; it carries the drops since the last one.
        (The queue's own method: an observer calls it for every event, with no hop.)"""
        self.offer_event: Callable[[bytes, ev.SessionEvent, NoticeSlot], None]
        self.offer_event = self._notices.offer_event
        """Admit and queue a session-event notification (the queue's own method too)."""
        self.offer_events: Callable[[bytes, Sequence[ev.SessionEvent], NoticeSlot], None]
        self.offer_events = self._notices.offer_events
        """`offer_event` each of a run of events, in one call."""
        self.admit: Callable[[NoticeSlot], bool] = self._notices.admit
        """Room for one more notification of `slot` to a READY plugin; if none, it is
        counted dropped. (The queue's own method, like `notify`.)"""
        self._stream: Stream | None = None
        self._write_lock = asyncio.Lock()
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
        self._notices.batches = BATCH_CAPABILITY in description.capabilities
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
        self._fail_all("the plugin was unregistered")
        self._router.close()
        await self.channel.close()

    # -- PluginCaller: calls go through the router, notifications through the queue ----

    def call(
        self, call: hk.HookCall, seconds: float, signal: AbortSignal
    ) -> Coroutine[Any, Any, hk.HookResult]:
        """Send a call and await its result within `seconds` (`CallRouter.call`)."""
        return self._router.call(call, seconds, signal)  # its coroutine: no frame of ours

    def stream(
        self,
        call: hk.HookCall,
        seconds: float,
        signal: AbortSignal,
        messages: Sequence[bytes | bytearray] | None = None,
    ) -> AsyncGenerator[st.StreamChunk, None]:
        """A `model_stream` call's chunks until the finish (`CallRouter.stream`)."""
        return self._router.stream(call, seconds, signal, messages)

    # -- the router's link ---------------------------------------------------------------

    def check_ready(self) -> None:
        """Raise `PluginCallFailed` ("disconnected") unless the stream is open."""
        if self.state != reg.PLUGIN_STATE_READY:
            raise PluginCallFailed("disconnected", f"the plugin is unavailable ({self.last_error})")

    async def send_now(self, request: bytes) -> None:
        """Write a call at once (no hop through the writer task).

        The notifications waiting go with it, before it, in one batch (`with_call`).
        """
        stream = self._stream
        if stream is None:
            raise PluginCallFailed("disconnected", f"the plugin is unavailable ({self.last_error})")
        try:
            async with self._write_lock:
                await stream.write(self._notices.with_call(request))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as error:
            raise PluginCallFailed("disconnected", f"the stream broke: {error}") from None

    def cancel(self, call_id: str, reason: str) -> None:
        """Tell the plugin a call was withdrawn, ahead of the notifications."""
        if self.state == reg.PLUGIN_STATE_READY:
            self._notices.cancel(cancel_request(call_id, reason))

    # -- the stream ----------------------------------------------------------------------

    def _set_state(self, state: reg.PluginState.ValueType) -> None:
        self.state = state
        self._notices.ready = state == reg.PLUGIN_STATE_READY
        self.on_state()

    async def _run(self) -> None:
        """Keep the stream open: each time it ends, wait the backoff and reopen it."""
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
            if await self._serve(self._handle(metadata=self.metadata), connected_before):
                connected_before, backoff = True, BACKOFF_START
            self._set_state(reg.PLUGIN_STATE_UNAVAILABLE)
            self._ready.clear()
            self._fail_all(self.last_error, self._failure_kind)
            self._failure_kind = "disconnected"
            log.warning("plugin at %s unavailable: %s", self.address, self.last_error)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
            self._set_state(reg.PLUGIN_STATE_CONNECTING)

    async def _serve(self, stream: Stream, reconnecting: bool) -> bool:
        """One stream's life: open, READY, read until it ends (`last_error` says why).

        Returns whether it opened.
        """
        writer: asyncio.Task[None] | None = None
        opened = False
        try:
            await stream.wait_for_connection()
            self._stream = stream
            self._set_state(reg.PLUGIN_STATE_READY)
            self._ready.set()
            if reconnecting:
                self.stats.reconnects += 1
            opened = True

            async def write(request: bytes) -> None:
                async with self._write_lock:
                    await stream.write(request)

            writer = asyncio.create_task(self._notices.write_loop(write))
            await self._read(stream)
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
        return opened

    async def _read(self, stream: Stream) -> None:
        """Hand each answer to the router, until the stream ends or breaks the protocol."""
        while True:
            response = await stream.read()
            if response is grpc.aio.EOF:
                self.last_error = "the plugin closed the stream"
                return
            if not isinstance(response, hk.HandleResponse):
                self._violation("a message that does not decode as a HandleResponse")
                return
            kind = response.WhichOneof("kind")
            if kind == "chunk":
                self._router.deliver(response.chunk)
            elif kind == "result":
                self._router.resolve(response.result)
            else:
                self._violation("a HandleResponse with no kind set")
                return

    def _violation(self, problem: str) -> None:
        """The plugin broke the protocol: its stream is reset, its calls fail as malformed."""
        self.stats.protocol_errors += 1
        self._failure_kind = "malformed"
        self.last_error = f"protocol violation: {problem}"

    def _fail_all(self, reason: str, kind: str = "disconnected") -> None:
        """The stream ended: its calls fail, its cancels and notifications are dropped."""
        self._router.fail_all(reason, kind)
        self._notices.clear()
