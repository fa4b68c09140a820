"""A small HTTP/1.1 client over asyncio streams.

Just what a streaming model API needs: one POST per connection (`Connection: close`),
TLS for https, a connect timeout, a timeout on every read, bodies framed by chunked
transfer encoding, by Content-Length or by the end of the connection, and a `close()`
that drops the socket at once (the abort path). There are no proxies, redirects,
compression or connection reuse.

Failures raise `TransportError`, a `CodedError` whose code says what happened and whose
`retryable` flag says whether the request may simply be sent again.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Awaitable, Mapping
from typing import TypeVar
from urllib.parse import urlsplit

from server.errors import CodedError

CONNECTION_FAILED = "CONNECTION_FAILED"
TIMEOUT = "TIMEOUT"
STREAM_INTERRUPTED = "STREAM_INTERRUPTED"
BAD_RESPONSE = "BAD_RESPONSE"

READ_SIZE = 64 * 1024
"""The most bytes one read asks for."""
MAX_LINE = 64 * 1024
"""The longest status, header or chunk-size line accepted."""
MAX_HEADERS = 128

# Framing and hop-by-hop headers are the client's business, never a caller's.
_RESERVED = frozenset({"host", "content-length", "connection", "transfer-encoding"})

T = TypeVar("T")


class TransportError(CodedError):
    """A failure below HTTP semantics: connecting, a timeout, a cut or malformed response."""

    def __init__(self, message: str, code: str, *, retryable: bool = False) -> None:
        super().__init__(message, code)
        self.retryable = retryable
        """True when nothing was received, so sending the request again is safe."""


async def post(
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    connect_timeout: float,
    read_timeout: float,
    ssl_context: ssl.SSLContext | None = None,
) -> Response:
    """Send one POST and read the response head; the body is left to `Response.read_some`.

    Args:
        url: An absolute http or https URL.
        headers: Request headers; Host, Content-Length and Connection are set here.
        body: The request body.
        connect_timeout: Seconds allowed for the TCP connection and the TLS handshake.
        read_timeout: Seconds allowed for each write and read after that.
        ssl_context: The TLS context for https; the system's default when None.

    Returns:
        The open response; the caller must `close()` it.

    Raises:
        TransportError: When connecting, sending or reading the head fails.
        ValueError: When `url` is not an absolute http(s) URL.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an absolute http(s) URL: {url!r}")
    host = parts.hostname
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    context = (ssl_context or ssl.create_default_context()) if https else None
    try:
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=host if https else None, limit=MAX_LINE
            )
    except TimeoutError:
        raise TransportError(
            f"could not connect to {host}:{port} within {connect_timeout:g} s",
            TIMEOUT,
            retryable=True,
        ) from None
    except OSError as error:
        # A certificate will not fix itself on a second attempt; a refused port might.
        raise TransportError(
            f"could not connect to {host}:{port}: {_describe(error)}",
            CONNECTION_FAILED,
            retryable=not isinstance(error, ssl.SSLError),
        ) from None
    response = Response(reader, writer, read_timeout)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [
            f"POST {target} HTTP/1.1",
            f"Host: {parts.netloc.rpartition('@')[2]}",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in headers.items() if k.lower() not in _RESERVED),
        ]
        await response.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await response.read_head()
    except BaseException:
        response.close()  # on failure and on cancellation alike: never leak the socket
        raise
    return response


class Response:
    """An HTTP response whose head has been read; the body is read piece by piece."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, read_timeout: float
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._timeout = read_timeout
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        """Header values by lowercase name; repeated headers are joined with ", "."""
        self._in_body = False
        self._chunked = False
        self._length: int | None = None
        self._chunk_left = 0
        self._after_chunk = False
        self._done = False

    async def send(self, request: bytes) -> None:
        """Write the request (head and body)."""
        self._writer.write(request)
        await self._io(self._writer.drain())

    async def read_head(self) -> None:
        """Read the status line and the headers, and learn how the body is framed."""
        while True:
            line = await self._line()
            match = re.fullmatch(r"HTTP/1\.[01] (\d{3})(?: (.*))?", line)
            if match is None:
                raise TransportError(f"malformed status line {line[:80]!r}", BAD_RESPONSE)
            self.status, self.reason = int(match[1]), match[2] or ""
            self.headers = await self._fields()
            if not 100 <= self.status < 200:
                break  # interim responses (100 Continue) are skipped
        self._in_body = True
        encoding = self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length", "")
        if self.status in (204, 304):
            self._done = True
        elif "chunked" in encoding:
            self._chunked = True
        elif length:
            if not length.isdigit():
                raise TransportError(f"malformed Content-Length {length[:40]!r}", BAD_RESPONSE)
            self._length = int(length)

    async def read_some(self) -> bytes:
        """The next piece of the body; b"" once the body ended cleanly.

        Raises:
            TransportError: STREAM_INTERRUPTED when the connection ends early, TIMEOUT
                when no byte arrives within the read timeout, BAD_RESPONSE on bad framing.
        """
        if self._done:
            return b""
        if self._chunked:
            if self._chunk_left == 0:
                if self._after_chunk and await self._line():
                    raise TransportError("chunk data is not followed by CRLF", BAD_RESPONSE)
                size = await self._line()
                digits = size.partition(";")[0].strip()  # chunk extensions are ignored
                if not digits or any(ch not in "0123456789abcdefABCDEF" for ch in digits):
                    raise TransportError(f"malformed chunk size {size[:40]!r}", BAD_RESPONSE)
                self._chunk_left = int(digits, 16)
                self._after_chunk = True
                if self._chunk_left == 0:
                    await self._fields()  # the trailer section
                    self._done = True
                    return b""
            data = await self._read(min(self._chunk_left, READ_SIZE))
            self._chunk_left -= len(data)
            return data
        if self._length is not None:
            if self._length == 0:
                self._done = True
                return b""
            data = await self._read(min(self._length, READ_SIZE))
            self._length -= len(data)
            return data
        data = await self._read(READ_SIZE, eof_ends=True)
        self._done = not data
        return data

    async def read_all(self, limit: int) -> bytes:
        """The body, or its first `limit` bytes when it is longer."""
        parts: list[bytes] = []
        size = 0
        while size < limit and (data := await self.read_some()):
            parts.append(data)
            size += len(data)
        return b"".join(parts)[:limit]

    def close(self) -> None:
        """Drop the connection at once; a pending read then ends; idempotent."""
        self._done = True
        if not self._writer.transport.is_closing():
            self._writer.transport.abort()

    async def _fields(self) -> dict[str, str]:
        fields: dict[str, str] = {}
        for _ in range(MAX_HEADERS):
            line = await self._line()
            if not line:
                return fields
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise TransportError(f"malformed header line {line[:80]!r}", BAD_RESPONSE)
            name, value = name.lower(), value.strip()
            fields[name] = f"{fields[name]}, {value}" if name in fields else value
        raise TransportError(f"more than {MAX_HEADERS} header lines", BAD_RESPONSE)

    async def _line(self) -> str:
        """One CRLF- (or LF-) terminated line without its terminator."""
        raw = await self._io(self._reader.readline())
        if not raw.endswith(b"\n"):
            raise self._cut()
        return raw.rstrip(b"\r\n").decode("latin-1")

    async def _read(self, size: int, *, eof_ends: bool = False) -> bytes:
        data = await self._io(self._reader.read(size))
        if not data and not eof_ends:
            raise self._cut()
        return data

    async def _io(self, work: Awaitable[T]) -> T:
        """Await `work` under the read timeout, mapping failures to `TransportError`."""
        try:
            async with asyncio.timeout(self._timeout):
                return await work
        except TimeoutError:
            raise TransportError(
                f"no data from the server for {self._timeout:g} s", TIMEOUT
            ) from None
        except ValueError:  # StreamReader's line limit
            raise TransportError(f"a line longer than {MAX_LINE} bytes", BAD_RESPONSE) from None
        except OSError as error:
            if self._in_body:
                raise TransportError(
                    f"the connection failed mid-response: {_describe(error)}", STREAM_INTERRUPTED
                ) from None
            raise TransportError(
                f"the connection failed before a response: {_describe(error)}",
                CONNECTION_FAILED,
                retryable=True,
            ) from None

    def _cut(self) -> TransportError:
        if self._in_body:
            return TransportError(
                "the connection closed before the response ended", STREAM_INTERRUPTED
            )
        return TransportError(
            "the connection closed before a complete response head",
            CONNECTION_FAILED,
            retryable=True,
        )


def _describe(error: OSError) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    return error.strerror or str(error) or type(error).__name__
