"""The HTTP client of the model providers, on httpx.

One pooled `httpx.AsyncClient` per provider: connections are kept alive and reused
across steps, proxies come from the environment (`HTTPS_PROXY`, `HTTP_PROXY`,
`NO_PROXY`), and every request carries `User-Agent: agentloop/<version>`. A response
is read piece by piece; closing it early (the abort path) drops its connection rather
than returning a half-read one to the pool.

Failures raise `TransportError`, a `CodedError` whose code says what happened and whose
`retryable` flag says whether the request may simply be sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping

import httpx

from server.kernel.errors import CodedError
from server.version import version

CONNECTION_FAILED = "CONNECTION_FAILED"
TIMEOUT = "TIMEOUT"
STREAM_INTERRUPTED = "STREAM_INTERRUPTED"
BAD_RESPONSE = "BAD_RESPONSE"

MAX_KEEPALIVE = 32
"""Idle connections kept per provider."""
KEEPALIVE_SECONDS = 60.0
"""How long an idle connection is kept."""
FINISH_SECONDS = 1.0
"""How long the end of a body is awaited after its content is done."""


def user_agent() -> str:
    """`agentloop/<version>`, the User-Agent of every model request."""
    return f"agentloop/{version()}"


class TransportError(CodedError):
    """A failure below HTTP semantics: connecting, a timeout, a cut or malformed response."""

    def __init__(self, message: str, code: str, *, retryable: bool = False) -> None:
        super().__init__(message, code)
        self.retryable = retryable
        """True when nothing was received, so sending the request again is safe."""


class HttpClient:
    """A pooled client for one provider; `aclose()` it when the provider goes away."""

    def __init__(
        self,
        *,
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Configure the pool; nothing connects until the first request.

        Args:
            headers: Headers of every request (User-Agent is added unless given).
            connect_timeout: Seconds for the TCP connection and the TLS handshake.
            read_timeout: Seconds any single read or write may wait.
            ssl_context: The TLS context for https; the system's default when None.
            transport: A transport to use instead of the network (tests of framing).
        """
        merged = {"User-Agent": user_agent()}
        merged.update(headers)
        self._client = httpx.AsyncClient(
            headers=merged,
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout, pool=connect_timeout),
            # No cap on open connections: every streaming agent holds one for its step.
            limits=httpx.Limits(
                max_connections=None,
                max_keepalive_connections=MAX_KEEPALIVE,
                keepalive_expiry=KEEPALIVE_SECONDS,
            ),
            verify=ssl_context or ssl.create_default_context(),
            trust_env=True,
            transport=transport,
        )

    async def post(self, url: str, body: bytes) -> Response:
        """Send one POST and read the response head; the body is left to `Response`.

        Raises:
            TransportError: When connecting, sending or reading the head fails.
        """
        request = self._client.build_request("POST", url, content=body)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException as error:
            raise TransportError(_timeout_text(error), TIMEOUT, retryable=True) from None
        except httpx.ConnectError as error:
            # A certificate will not fix itself on a second attempt; a refused port might.
            certificate = isinstance(error.__cause__, ssl.SSLError) or "CERTIFICATE" in str(error)
            raise TransportError(
                f"could not connect to {request.url.host}:{request.url.port or ''}:"
                f" {_describe(error)}",
                CONNECTION_FAILED,
                retryable=not certificate,
            ) from None
        except (httpx.TransportError, httpx.DecodingError) as error:
            raise TransportError(
                f"the connection failed before a response: {_describe(error)}",
                CONNECTION_FAILED,
                retryable=True,
            ) from None
        return Response(response)

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self._client.aclose()


class Response:
    """An HTTP response whose head has been read; the body is read piece by piece."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.reason = response.reason_phrase
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        """Header values by lowercase name; repeated headers are joined with ", "."""
        self._pieces: AsyncIterator[bytes] = response.aiter_bytes()

    async def read_some(self) -> bytes:
        """The next piece of the body; b"" once the body ended cleanly.

        Raises:
            TransportError: STREAM_INTERRUPTED when the connection ends early, TIMEOUT
                when no byte arrives within the read timeout, BAD_RESPONSE on bad framing.
        """
        try:
            return await anext(self._pieces, b"")
        except httpx.TimeoutException as error:
            raise TransportError(_timeout_text(error), TIMEOUT) from None
        except httpx.RemoteProtocolError as error:
            raise TransportError(
                f"the connection closed before the response ended: {_describe(error)}",
                STREAM_INTERRUPTED,
            ) from None
        except (httpx.TransportError, httpx.DecodingError, httpx.StreamError) as error:
            raise TransportError(
                f"the connection failed mid-response: {_describe(error)}", STREAM_INTERRUPTED
            ) from None

    async def read_all(self, limit: int) -> bytes:
        """The body, or its first `limit` bytes when it is longer."""
        parts: list[bytes] = []
        size = 0
        while size < limit and (data := await self.read_some()):
            parts.append(data)
            size += len(data)
        return b"".join(parts)[:limit]

    async def finish(self) -> None:
        """Read the rest of a body whose content is done (after `[DONE]`), briefly.

        Only a body read to its end returns its connection to the pool; a server that
        keeps it open past that costs the connection, not the step.
        """
        with contextlib.suppress(TransportError, TimeoutError):
            async with asyncio.timeout(FINISH_SECONDS):
                while await self.read_some():
                    pass

    async def aclose(self) -> None:
        """Release the connection: back to the pool when read whole, dropped otherwise."""
        await self._response.aclose()


def _timeout_text(error: httpx.TimeoutException) -> str:
    if isinstance(error, httpx.ConnectTimeout | httpx.PoolTimeout):
        return "could not connect within the connect timeout"
    return "no data from the server within the read timeout"


def _describe(error: BaseException) -> str:
    """The root cause in words: httpx wraps the OS error in one or two layers."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    return str(error) or type(error).__name__
