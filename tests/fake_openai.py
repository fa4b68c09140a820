"""A fake OpenAI-compatible Chat Completions server on a real local socket.

Connections are kept alive between requests (HTTP/1.1), unless a reply closes them,
and counted in `connections`. Each request takes the next scripted `Reply` (status,
headers, a JSON body or a stream of server-sent events sent with chunked transfer
encoding, optional delays, a cut) and is recorded as a `Seen`: its headers, its JSON
body, when it arrived, on which connection, and whether the client hung up before the
reply was fully written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 429: "Too Many Requests"}


@dataclass
class Event:
    """One `data:` event: a JSON value, or a string sent verbatim (e.g. invalid JSON)."""

    data: Any
    delay: float = 0.0
    """Seconds slept before sending it."""


@dataclass
class Raw:
    """Bytes written as they are, as one body chunk (comments, CRLF, split events)."""

    data: bytes
    delay: float = 0.0


@dataclass
class Reply:
    """The scripted answer to one request."""

    status: int = 200
    events: Sequence[Event | Raw | dict[str, Any] | str] = ()
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    """A JSON body instead of an event stream (for error statuses)."""
    done: bool = True
    """End the stream with `data: [DONE]`."""
    cut_after: int | None = None
    """Close the connection after this many events, mid-body."""
    framing: Literal["chunked", "close"] = "chunked"
    """Chunked transfer encoding, or a body delimited by closing the connection."""
    drop: bool = False
    """Hang up without answering at all."""
    headers_at_send: Callable[[], dict[str, str]] | None = None
    """More headers, made as the reply is sent (a `Retry-After` date relative to then)."""


@dataclass
class Seen:
    """One request the fake received."""

    method: str
    path: str
    headers: dict[str, str]
    """By lowercase name."""
    body: Any
    time: float
    """`time.monotonic()` when the request was read."""
    wall_time: float = 0.0
    """`time.time()` when the request was read (to compare with an HTTP date)."""
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the client closed the connection before the reply was fully sent."""
    completed: bool = False
    """True once the whole reply was written."""
    connection: int = 0
    """Which TCP connection it came on, from 1."""
    raw: bytes = b""
    """The body's bytes, as sent."""


class FakeOpenAI:
    """The server; use `async with FakeOpenAI() as fake:` and `fake.base_url`."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Seen] = []
        self.connections = 0
        """TCP connections accepted so far."""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._arrived = asyncio.Condition()
        self.base_url = ""

    def script(self, *replies: Reply) -> None:
        """Queue replies, answered in request order."""
        self.replies.extend(replies)

    async def wait_for_requests(self, count: int) -> None:
        """Return once `count` requests have arrived."""
        async with self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= count)

    async def __aenter__(self) -> FakeOpenAI:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Our own shutdown; asyncio (3.11) logs a connection handler that ends cancelled.
            writer.transport.abort()
        finally:
            self._handlers.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection = self.connections
        try:
            early = b""  # bytes of the next request read while watching for a hang-up
            while True:
                seen = await self._read_request(reader, early)
                if seen is None:
                    return  # the client closed an idle connection
                seen.connection = connection
                self.requests.append(seen)
                async with self._arrived:
                    self._arrived.notify_all()
                watcher = asyncio.create_task(_watch(reader, seen))
                reply = self.replies.popleft() if self.replies else _unscripted()
                try:
                    await _respond(writer, reply, seen)
                finally:
                    watcher.cancel()
                    await asyncio.gather(watcher, return_exceptions=True)
                early = watcher.result() if not watcher.cancelled() else b""
                keep = seen.completed and not seen.hung_up.is_set()
                if not keep or reply.framing == "close" or reply.cut_after is not None:
                    return
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1)

    async def _read_request(self, reader: asyncio.StreamReader, early: bytes) -> Seen | None:
        first = early + await reader.readline() if not early.endswith(b"\n") else early
        if not first:
            return None
        method, path, _ = first.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while line := (await reader.readline()).decode("latin-1").rstrip("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body = json.loads(raw) if raw else None
        return Seen(method, path, headers, body, time.monotonic(), time.time(), raw=raw)


async def _watch(reader: asyncio.StreamReader, seen: Seen) -> bytes:
    """Until the reply is whole the client sends nothing: an EOF or reset is a hang-up.

    Returns what was read: after a whole reply, the start of the next request.
    """
    data = b""
    with contextlib.suppress(ConnectionError):
        data = await reader.read(1)
    if not seen.completed:
        seen.hung_up.set()
    return data


def _unscripted() -> Reply:
    return Reply(status=400, body={"error": {"message": "fake: no reply scripted"}})


async def _respond(writer: asyncio.StreamWriter, reply: Reply, seen: Seen) -> None:
    if reply.drop:
        return
    head = [f"HTTP/1.1 {reply.status} {REASONS.get(reply.status, 'Status')}"]
    if reply.headers_at_send is not None:
        reply = dataclasses.replace(reply, headers={**reply.headers, **reply.headers_at_send()})
    if reply.body is not None:
        payload = json.dumps(reply.body).encode()
        head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        head += [f"{k}: {v}" for k, v in reply.headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        seen.completed = True
        return
    chunked = reply.framing == "chunked"
    head += ["Content-Type: text/event-stream", "Cache-Control: no-cache"]
    head += ["Transfer-Encoding: chunked"] if chunked else ["Connection: close"]
    head += [f"{k}: {v}" for k, v in reply.headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    await writer.drain()
    items = [*reply.events, *([Event("[DONE]")] if reply.done else [])]
    for sent, item in enumerate(items):
        if reply.cut_after is not None and sent >= reply.cut_after:
            return  # no terminating chunk: the client sees the body end early
        event = item if isinstance(item, Event | Raw) else Event(item)
        if event.delay:
            # Wake early when the client hangs up, so the server stops sending at once.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(seen.hung_up.wait(), event.delay)
        if seen.hung_up.is_set():
            return
        writer.write(_frame(_encode(event), chunked))
        await writer.drain()
    if chunked:
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    seen.completed = True


def _encode(event: Event | Raw) -> bytes:
    if isinstance(event, Raw):
        return event.data
    data = event.data if isinstance(event.data, str) else json.dumps(event.data)
    return f"data: {data}\n\n".encode()


def _frame(data: bytes, chunked: bool) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n" if chunked else data


# -- chat.completion.chunk builders ---------------------------------------------------------


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One `chat.completion.chunk`; a usage-only chunk has no choices (as OpenAI sends it)."""
    body: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk"}
    body["choices"] = (
        [] if delta is None and finish is None else [
            {"index": 0, "delta": delta or {}, "finish_reason": finish}
        ]
    )  # fmt: skip
    if usage is not None:
        body["usage"] = usage
    return body


def text(*pieces: str, finish: str | None = "stop") -> list[dict[str, Any]]:
    """A text reply streamed piece by piece, then its finish."""
    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": piece}) for piece in pieces]
    return [*out, chunk(finish=finish)] if finish else out


def call(
    index: int, arguments: str, call_id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    """A tool-call fragment; the first fragment of a call carries its id and name."""
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        fragment["id"] = call_id
        fragment["type"] = "function"
    if name is not None:
        fragment["function"]["name"] = name
    return chunk({"tool_calls": [fragment]})


def usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    """A usage-only chunk."""
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    return chunk(usage=body)
