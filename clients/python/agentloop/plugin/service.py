"""The gRPC side of a plugin: the `HookService` servicer, its `Handle` streams, the server.

Each `HookCall` on a `Handle` stream runs as its own asyncio task, so many calls are in
flight at once; each task writes its result itself as soon as it has it, under the
stream's write lock (grpc.aio writes must never overlap), which saves a hop through a
queue on every call. A call (or notification) whose handler cannot suspend (an
`async def` that never awaits: `agentloop.plugin.inline`) runs in place instead, as
it is read, with no task; the results of the message's calls run so are written
before the next message is read. A call's deadline (`HookCall.timeout`) is an entry
in the stream's deadline heap, not a timer of its own: one timer waits for the
earliest, and a call still running at its deadline is cancelled and not answered.
Results are written as bytes (the `Handle` response serializer is the identity): no
`HandleResponse` copy of each result. A `model_stream` call's chunks are written the
same way, each as soon as the model produces it. A `CancelCall` cancels the call's task (a model's
generator is closed) and nothing more is sent for it. Notifications get no result. A
`CallBatch` is taken apart and each of its calls handled as if it had come alone (the
plugin asks for batches in `Describe` when the server offers them).
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Coroutine
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

# isort: off
from agentloop.plugin import polled_listener  # noqa: F401  # first: it sets up grpc's loading
import grpc  # the plugin's transport edge, like the server's api_*.py
# isort: on

from agentloop.plugin import tracing
from agentloop.plugin.calls import error_text, failure
from agentloop.plugin.inline import resumed
from agentloop.plugin.transport import MAX_MESSAGE_BYTES, Deadline, Deadlines, field_key, varint
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.plugin.v1 import hook_service_pb2_grpc as rpc

if TYPE_CHECKING:
    from agentloop.plugin.sdk import Plugin

log = logging.getLogger("agentloop.plugin")

Context = grpc.aio.ServicerContext[Any, Any]

BATCH_CAPABILITY = "call_batch"
"""Listed in `Describe` when the server offers it: calls may come several in a message."""


class _CallDeadline(Deadline):
    """A call's deadline on the plugin's side: at it, the call's task is cancelled."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Task[None]) -> None:
        super().__init__()
        self.task = task

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()


class CallStream:
    """One `Handle` stream: its calls in flight, by call id, and its writes."""

    def __init__(self, plugin: Plugin, context: Context) -> None:
        self._plugin = plugin
        self._context = context
        self._subscriptions = plugin.registry.subscriptions
        self._answered: list[hs.HookResult] = []
        """The results of the calls run in place from the message being read."""
        self._writing = False
        """The reader is writing those results (a drain waits for them)."""
        self._calls: dict[str, asyncio.Task[None]] = {}
        """The cancellable calls in flight, by call id."""
        self._running: set[asyncio.Task[None]] = set()
        """Every task still running, cancelled or not (awaited when the stream ends)."""
        self._write_lock = asyncio.Lock()
        self._deadlines = Deadlines()
        """The deadlines of the calls that have one (`agentloop.plugin.transport`)."""
        self._timed: dict[asyncio.Task[None], _CallDeadline] = {}
        """The calls still running under their deadline (not yet answering)."""
        self._done = asyncio.Event()
        """Set when the stream should end: the server closed its side, or a drain ended."""
        self._draining = False

    async def serve(self, requests: AsyncIterator[hs.HandleRequest]) -> None:
        """Read `requests` in the background until the stream should end."""
        reader = asyncio.create_task(self._read(requests), name="agentloop-plugin reader")
        try:
            await self._done.wait()
            if reader.done():
                reader.result()  # a failed read fails the stream
        finally:
            reader.cancel()
            for task in self._running:
                task.cancel()
            await asyncio.gather(reader, *self._running, return_exceptions=True)
            self._deadlines.close()

    def drain(self) -> None:
        """Refuse new calls, and end the stream once the calls in flight are answered."""
        self._draining = True
        if not self._running and not self._writing:
            self._done.set()

    async def _read(self, requests: AsyncIterator[hs.HandleRequest]) -> None:
        try:
            async for request in requests:
                kind = request.WhichOneof("kind")
                if kind == "call":
                    self._start(request.call)
                elif kind == "batch":  # each handled as if it had come alone
                    for call in request.batch.calls:
                        self._start(call)
                elif kind == "cancel":
                    task = self._calls.pop(request.cancel.call_id, None)
                    if task is not None:
                        task.cancel()
                if self._answered:
                    await self._write_answered()
            while self._running:  # the server closed its side: answer what is in flight
                await asyncio.wait(set(self._running))
        finally:
            self._done.set()

    def _start(self, call: hs.HookCall) -> None:
        if call.call_id and call.call_id in self._calls:
            log.warning("plugin %s: duplicate call id %s ignored", self._plugin.name, call.call_id)
            return
        if self._draining:
            refused = failure(call.call_id, "the plugin is stopping")
            self._track(asyncio.create_task(self._send_result(refused)))
            return
        payload = call.WhichOneof("payload")
        subscription = self._subscriptions.get(payload) if payload else None
        if subscription is not None and subscription.inline and not self._traced(call):
            self._run_in_place(call)
            return
        streams = payload == "model_stream"
        work = self._run(call) if streams else self._answer(call)
        self._spawn(call, work, streams)

    @staticmethod
    def _traced(call: hs.HookCall) -> bool:
        """Whether `call` runs in a span of its own (the server traces, OpenTelemetry is here)."""
        return bool(call.traceparent) and tracing.available()

    def _spawn(
        self,
        call: hs.HookCall,
        work: Coroutine[Any, Any, None],
        streams: bool = False,
        context: contextvars.Context | None = None,
    ) -> None:
        """Run `work` (the running of `call`) as a task, under the call's deadline."""
        if call.traceparent:  # the server traces: continue its trace (agentloop.plugin.tracing)
            work = tracing.traced(self._plugin.name, call, work)
        name = f"agentloop-plugin call {call.call_id}"
        task = asyncio.create_task(work, name=name, context=context)
        if call.call_id:
            self._calls[call.call_id] = task
        self._track(task)
        if not streams and call.HasField("timeout"):
            seconds = call.timeout.ToNanoseconds() / 1e9
            if seconds > 0:
                self._time(task, seconds)

    def _run_in_place(self, call: hs.HookCall) -> None:
        """Run a call whose handler cannot suspend, now; its result is written after the message.

        In a copy of the context, as a task would run it. Should it suspend after all, the
        rest runs as a task like any other call's.
        """
        work = self._plugin.registry.answer(call)
        context = contextvars.copy_context()
        try:
            waiting = context.run(work.send, None)
        except StopIteration as done:
            if done.value is not None:
                self._answered.append(done.value)
            return
        except asyncio.CancelledError:  # as a task cancelled by its handler: nothing sent
            return
        except Exception as exc:  # answer() answers handler errors itself: a bug guard
            log.exception("plugin %s: call %s", self._plugin.name, call.call_id)
            self._answered.append(failure(call.call_id, error_text(exc)))
            return
        self._spawn(call, self._answer(call, resumed(work, waiting)), context=context)

    async def _write_answered(self) -> None:
        """Write the results of the calls run in place (in their order)."""
        answered, self._answered = self._answered, []
        if self._write_lock.locked():  # a model stream is writing: reading goes on meanwhile
            for result in answered:
                self._track(asyncio.create_task(self._send_result(result)))
            return
        self._writing = True
        try:
            for result in answered:
                await self._send_result(result)
        except Exception as exc:  # the stream ended: the next read ends the reader too
            log.debug("plugin %s: a result was not written: %r", self._plugin.name, exc)
        finally:
            self._writing = False
            if self._draining and not self._running:
                self._done.set()

    def _time(self, task: asyncio.Task[None], seconds: float) -> None:
        """Cancel `task` if it still runs `seconds` from now."""
        self._timed[task] = self._deadlines.add(_CallDeadline(task), seconds)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._running.add(task)
        task.add_done_callback(self._finished)

    async def _run(self, call: hs.HookCall) -> None:
        """A `model_stream` call: its chunks (or its failure) as they come."""
        me = asyncio.current_task()
        ended = False  # a result, or a model call's finish, was sent
        try:
            async with aclosing(self._plugin.registry.responses(call)) as responses:
                async for response in responses:
                    if call.call_id and self._calls.get(call.call_id) is not me:
                        return  # withdrawn: nothing more is sent
                    await self._send(response)
                    ended = response.HasField("result") or response.chunk.chunk.HasField("finish")
        except Exception as exc:  # responses() answers handler errors itself: a bug guard
            log.exception("plugin %s: call %s", self._plugin.name, call.call_id)
            if not ended and (not call.call_id or self._calls.get(call.call_id) is me):
                await self._send_result(failure(call.call_id, error_text(exc)))
        finally:
            if call.call_id and self._calls.get(call.call_id) is me:
                del self._calls[call.call_id]

    async def _answer(
        self, call: hs.HookCall, work: Awaitable[hs.HookResult | None] | None = None
    ) -> None:
        """A call with one result (or none): the short path, with no generator per call.

        `work` is its running, when it has begun already (else it begins here).
        """
        me = asyncio.current_task()
        assert me is not None
        try:
            result = await (self._plugin.registry.answer(call) if work is None else work)
        except asyncio.CancelledError:
            deadline = self._timed.get(me)
            if deadline is None or not deadline.expired or me.uncancel():
                raise  # withdrawn (CancelCall), or the stream ends
            log.warning("plugin %s: call %s passed its deadline", self._plugin.name, call.call_id)
            result = None
        except Exception as exc:  # answer() answers handler errors itself: a bug guard
            log.exception("plugin %s: call %s", self._plugin.name, call.call_id)
            result = failure(call.call_id, error_text(exc))
        finally:
            deadline = self._timed.pop(me, None)
            if deadline is not None:  # answering: the deadline no longer applies
                deadline.ended = True
            withdrawn = bool(call.call_id) and self._calls.get(call.call_id) is not me
            if call.call_id and not withdrawn:
                del self._calls[call.call_id]
        if result is not None and not withdrawn:
            await self._send_result(result)

    async def _send(self, response: hs.HandleResponse) -> None:
        async with self._write_lock:
            await self._context.write(response.SerializeToString())

    async def _send_result(self, result: hs.HookResult) -> None:
        """Write `HandleResponse(result=result)`, framed from the result's own bytes."""
        encoded = result.SerializeToString()
        async with self._write_lock:
            await self._context.write(b"".join((_RESULT, varint(len(encoded)), encoded)))

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if self._draining and not self._running and not self._writing:
            self._done.set()


_RESULT = field_key(hs.HandleResponse.RESULT_FIELD_NUMBER)
"""The field key of `HandleResponse.result`."""


class HookServicer(rpc.HookServiceServicer):
    """`HookService` for one plugin: `Describe` from its registrations, `Handle` streams."""

    def __init__(self, plugin: Plugin) -> None:
        self._plugin = plugin
        self.streams: set[CallStream] = set()

    async def _authorize(self, context: Context) -> None:
        """Abort with UNAUTHENTICATED unless the plugin's bearer token was sent."""
        token = self._plugin.token
        if not token:
            return
        sent = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                sent = value
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"plugin {self._plugin.name} requires 'authorization: Bearer <token>'",
            )

    async def Describe(self, request: hs.DescribeRequest, context: Context) -> hs.DescribeResponse:
        """The plugin's name, version, subscriptions and tools."""
        await self._authorize(context)
        description = self._plugin.describe()
        if BATCH_CAPABILITY in request.capabilities:  # offered: this helper reads batches
            description.capabilities.append(BATCH_CAPABILITY)
        return description

    async def Handle(  # type: ignore[override]  # writes with context.write, not by yielding
        self, request_iterator: AsyncIterator[hs.HandleRequest], context: Context
    ) -> None:
        """Serve the calls of one server stream until it closes."""
        await self._authorize(context)
        await context.send_initial_metadata(())  # the server sees the stream open at once
        stream = CallStream(self._plugin, context)
        self.streams.add(stream)
        try:
            await stream.serve(request_iterator)
        finally:
            self.streams.discard(stream)


def handlers(servicer: HookServicer) -> grpc.GenericRpcHandler:
    """`HookService`'s methods, `Handle` written as bytes (its serializer is the identity)."""
    return grpc.method_handlers_generic_handler(
        "agentloop.plugin.v1.HookService",
        {
            "Describe": grpc.unary_unary_rpc_method_handler(
                servicer.Describe,
                request_deserializer=hs.DescribeRequest.FromString,
                response_serializer=hs.DescribeResponse.SerializeToString,
            ),
            "Handle": grpc.stream_stream_rpc_method_handler(
                servicer.Handle,
                request_deserializer=hs.HandleRequest.FromString,
                response_serializer=None,
            ),
        },
    )


class PluginServer:
    """A gRPC server serving one plugin."""

    def __init__(self, plugin: Plugin, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._servicer = HookServicer(plugin)
        # gRPC's default receive limit (4 MiB) is below the server's: raise it to match.
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
            ]
        )
        self._server.add_generic_rpc_handlers((handlers(self._servicer),))

    async def start(self, address: str, tls: tuple[bytes, bytes] | None = None) -> int:
        """Bind `address` (with TLS when `tls` is (key, cert) PEM) and start; returns the port."""
        if tls is None:
            port = self._server.add_insecure_port(address)
        else:
            credentials = grpc.ssl_server_credentials([tls])
            port = self._server.add_secure_port(address, credentials)
        if port == 0:
            raise OSError(f"cannot listen on {address}")
        await self._server.start()
        return port

    async def stop(self, grace: float | None) -> None:
        """Drain every stream (new calls are refused), then stop within `grace` seconds."""
        for stream in list(self._servicer.streams):
            stream.drain()
        await self._server.stop(grace)
