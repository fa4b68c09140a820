"""An OpenAI-compatible Chat Completions provider that streams over pooled HTTP.

It speaks to OpenAI and to the many servers that copy its API (DeepSeek, vLLM, Ollama,
llama.cpp, LiteLLM, OpenRouter, ...). Wire mapping lives in `openai_wire`, the HTTP
client in `http`, event-stream decoding in `sse`.

The configuration a server would read for one provider entry (the key itself is never
in the file: the file names the environment variable that holds it)::

    providers:
      - name: openai                  # the name agents select with `provider`
        type: openai                  # this module
        baseUrl: https://api.openai.com/v1   # POSTs go to <baseUrl>/chat/completions
        apiKeyEnv: OPENAI_API_KEY     # empty or unset: no Authorization header
        defaultModel: gpt-4o-mini     # for agents that name no model
        headers: {OpenAI-Organization: org-123}   # extra request headers
        connectTimeoutSeconds: 10     # TCP connect and TLS handshake
        maxTokensField: auto          # max_tokens, max_completion_tokens, or auto: the
                                      # latter for OpenAI's reasoning models (o1, o3, gpt-5...)
        readTimeoutSeconds: 300       # the longest silence tolerated mid-request
        maxAttempts: 3                # 1 = never retry
        initialBackoffSeconds: 0.5    # doubled per retry, with jitter ...
        maxBackoffSeconds: 8          # ... up to this
        maxRetryAfterSeconds: 60      # cap on a server's Retry-After

Proxies come from `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`. A Retry-After may be seconds
or an HTTP date; `retry-after-ms` (milliseconds) is preferred when both are sent.

Retries happen only before the response is accepted (so never after a chunk was
yielded), only for 429, 5xx and connection failures. Nothing here ever logs or reports
the API key: error texts from the server are scrubbed of it, and `repr` hides it.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from agentloop.v1 import stream_pb2
from server.kernel.abort import AbortSignal
from server.kernel.errors import CodedError
from server.models import ModelRequest
from server.models.http import (
    BAD_RESPONSE,
    STREAM_INTERRUPTED,
    HttpClient,
    Response,
    TransportError,
)
from server.models.openai_body import ChatHistory, request_bytes_in_slices
from server.models.openai_wire import (
    BAD_CHUNK,
    CONTEXT_LENGTH_EXCEEDED,
    MAX_TOKENS_FIELDS,
    DeltaTranslator,
    error_message,
    is_overflow,
)
from server.models.sse import EventStreamDecoder
from server.observability import observe
from server.observability.logs import fields

log = logging.getLogger(__name__)

MAX_ERROR_BODY = 64 * 1024
"""The most bytes of an error response read for its message."""
MAX_ERROR_TEXT = 500
"""The most characters of a provider's error text put in a message."""


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before sending a failed request again."""

    max_attempts: int = 3
    """Attempts in all, the first included; 1 never retries."""
    initial_backoff: float = 0.5
    """Seconds before the first retry; doubled for each next one."""
    max_backoff: float = 8.0
    """The longest computed backoff, in seconds."""
    max_retry_after: float = 60.0
    """The longest wait a server's Retry-After may ask for, in seconds."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if min(self.initial_backoff, self.max_backoff, self.max_retry_after) < 0:
            raise ValueError("backoff and Retry-After limits must not be negative")

    def backoff(self, attempt: int) -> float:
        """The wait after failed attempt `attempt` (from 1): exponential, half jittered."""
        ceiling = min(self.max_backoff, self.initial_backoff * 2.0 ** (attempt - 1))
        # Jitter spreads clients that failed together, so they do not retry together.
        return ceiling * (0.5 + random.random() / 2)


class ProviderSettings(Protocol):
    """A configured provider (the config's `providers:` entry), as this model reads it."""

    @property
    def name(self) -> str: ...  # noqa: D102
    @property
    def base_url(self) -> str: ...  # noqa: D102
    @property
    def headers(self) -> tuple[tuple[str, str], ...]: ...  # noqa: D102
    @property
    def default_model(self) -> str: ...  # noqa: D102
    @property
    def connect_timeout_seconds(self) -> float: ...  # noqa: D102
    @property
    def read_timeout_seconds(self) -> float: ...  # noqa: D102
    @property
    def max_attempts(self) -> int: ...  # noqa: D102
    @property
    def initial_backoff_seconds(self) -> float: ...  # noqa: D102
    @property
    def max_backoff_seconds(self) -> float: ...  # noqa: D102
    @property
    def max_retry_after_seconds(self) -> float: ...  # noqa: D102
    @property
    def max_tokens_field(self) -> str: ...  # noqa: D102


class OpenAIModel:
    """A `Model` for OpenAI-compatible `/chat/completions` streaming endpoints."""

    @classmethod
    def configured(cls, settings: ProviderSettings, api_key: str) -> OpenAIModel:
        """The model of a configured provider: the one place its settings become arguments."""
        return cls(
            name=settings.name,
            base_url=settings.base_url,
            api_key=api_key,
            headers=dict(settings.headers),
            default_model=settings.default_model,
            connect_timeout=settings.connect_timeout_seconds,
            read_timeout=settings.read_timeout_seconds,
            max_attempts=settings.max_attempts,
            initial_backoff=settings.initial_backoff_seconds,
            max_backoff=settings.max_backoff_seconds,
            max_retry_after=settings.max_retry_after_seconds,
            max_tokens_field=settings.max_tokens_field,
        )

    def __init__(
        self,
        *,
        name: str = "openai",
        base_url: str = "https://api.openai.com/v1",
        api_key: str = "",
        headers: Mapping[str, str] | None = None,
        default_model: str = "",
        connect_timeout: float = 10.0,
        read_timeout: float = 300.0,
        max_attempts: int = 3,
        initial_backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        max_tokens_field: str = "auto",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Configure the provider; nothing connects until the first `stream`.

        Args:
            name: The provider name, used in messages ("openai: HTTP 401: ...").
            base_url: The API root; requests go to `<base_url>/chat/completions`.
            api_key: Sent as `Authorization: Bearer <key>` when not empty.
            headers: Extra request headers; they override the defaults.
            default_model: The model sent when the request names none.
            connect_timeout: Seconds for the TCP connection and the TLS handshake.
            read_timeout: Seconds any single read (or write) may wait.
            max_attempts: Attempts per request, the first included.
            initial_backoff: Seconds before the first retry, doubled for each next one.
            max_backoff: The longest backoff, in seconds.
            max_retry_after: The longest Retry-After honoured, in seconds.
            ssl_context: The TLS context for https; the system default when None.
            max_tokens_field: "max_tokens", "max_completion_tokens", or "auto" (the
                latter for OpenAI's reasoning models, the former otherwise).
            transport: An httpx transport instead of the network (tests of framing).

        Raises:
            ValueError: For a base URL that is not http(s), a header with a line break,
                or a bad retry setting.
        """
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{name}: base_url must be an http:// or https:// URL")
        _ = parts.port  # raises ValueError for a malformed port, now rather than per call
        if connect_timeout <= 0 or read_timeout <= 0:
            raise ValueError(f"{name}: timeouts must be positive")
        if max_tokens_field not in MAX_TOKENS_FIELDS:
            raise ValueError(f"{name}: max_tokens_field must be one of {MAX_TOKENS_FIELDS}")
        self.max_tokens_field = max_tokens_field
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.default_model = default_model
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.retry = RetryPolicy(max_attempts, initial_backoff, max_backoff, max_retry_after)
        self._api_key = api_key
        merged = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            merged["Authorization"] = f"Bearer {api_key}"
        for key, value in (headers or {}).items():
            merged = {k: v for k, v in merged.items() if k.lower() != key.lower()}
            merged[key] = value
        for key, value in merged.items():
            if any(ch in key + value for ch in "\r\n\0"):
                raise ValueError(f"{name}: header {key!r} contains a line break")  # not the value
        self._headers = merged
        self._http = HttpClient(
            headers=merged,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            ssl_context=ssl_context,
            transport=transport,
        )
        self._url = f"{self.base_url}/chat/completions"
        self._histories: dict[str, ChatHistory] = {}
        """Per agent, its history's JSON as sent (`openai_body`), extended per request."""

    def release(self, agent_id: str) -> None:
        """Drop the kept history of `agent_id` (the agent was disposed)."""
        self._histories.pop(agent_id, None)

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()

    def __repr__(self) -> str:
        key = "<set>" if self._api_key else "<none>"
        return (
            f"OpenAIModel(name={self.name!r}, base_url={self.base_url!r}, "
            f"default_model={self.default_model!r}, api_key={key}, "
            f"headers={sorted(self._headers)})"
        )

    async def stream(
        self, request: ModelRequest, signal: AbortSignal
    ) -> AsyncIterator[stream_pb2.StreamChunk]:
        """Stream one chat completion as chunks.

        Args:
            request: The model call.
            signal: Aborting it drops the connection at once and raises `Aborted`.

        Yields:
            Block starts, deltas and ends, then the usage (when reported), then one finish.

        Raises:
            CodedError: HTTP_<status>, CONNECTION_FAILED, TIMEOUT, STREAM_INTERRUPTED,
                BAD_CHUNK, STREAM_ERROR, BAD_RESPONSE.
            Aborted: When `signal` fires.
        """
        signal.raise_if_aborted()
        model = request.header.config.model or self.default_model
        history = self._histories.get(request.agent_id)
        if history is None:
            history = self._histories[request.agent_id] = ChatHistory()
        # A long backlog (a first request) is encoded in slices, other tasks running between.
        body = await request_bytes_in_slices(request, model, self.max_tokens_field, history, signal)
        context = fields(
            agent=request.agent_id, session=request.session_id, turn=request.turn,
            step=request.step,
        )  # fmt: skip
        response = await self._open(body, signal, context)
        translator = DeltaTranslator(self.name)
        decoder = EventStreamDecoder()
        try:
            done = False
            while not done:
                try:
                    # An abort cancels the read; closing the response then drops the socket.
                    piece = await signal.race(response.read_some())
                except TransportError as error:
                    if translator.finish_reason is None:
                        raise self._failure(error) from None
                    break  # the answer is whole; only the usage or [DONE] was lost
                signal.raise_if_aborted()
                chunks, done = self._translate(decoder, translator, piece)
                for chunk in chunks:
                    yield chunk
                if not piece and not done:
                    if translator.finish_reason is None:
                        raise CodedError(
                            f"{self.name}: the stream ended before its finish", STREAM_INTERRUPTED
                        )
                    done = True
            await response.finish()  # so that the connection goes back to the pool
            for chunk in translator.end():
                yield chunk
        finally:
            await response.aclose()

    def _translate(
        self, decoder: EventStreamDecoder, translator: DeltaTranslator, piece: bytes
    ) -> tuple[list[stream_pb2.StreamChunk], bool]:
        """The chunks for one piece of body (b"" at its end), and whether [DONE] came."""
        chunks: list[stream_pb2.StreamChunk] = []
        try:
            for event in decoder.feed(piece) if piece else decoder.close():
                if event.data == "[DONE]":
                    return chunks, True
                try:
                    payload = json.loads(event.data)
                except json.JSONDecodeError:
                    raise CodedError(
                        f"invalid JSON in a stream event: {event.data[:80]!r}", BAD_CHUNK
                    ) from None
                chunks.extend(translator.feed(payload))
        except CodedError as error:
            raise self._failure(error) from None
        return chunks, False

    async def _open(self, body: bytes, signal: AbortSignal, context: dict[str, object]) -> Response:
        """POST `body`, retrying as the policy allows, until a 2xx response head arrives."""
        attempt = 1
        while True:
            try:
                response = await signal.race(self._post(body))
            except TransportError as error:
                if not error.retryable or attempt >= self.retry.max_attempts:
                    raise self._failure(error) from None
                delay, cause = self.retry.backoff(attempt), error.code
            else:
                status = response.status
                # JSON with a 2xx: a server that ignored `stream`, or an error said as success.
                json_body = response.headers.get("content-type", "").startswith("application/json")
                if 200 <= status < 300 and not json_body:
                    return response
                try:
                    detail, overflow = await self._error_detail(response, signal)
                finally:
                    await response.aclose()
                if status < 300:
                    raise CodedError(
                        f"{self.name}: expected an event stream, got JSON: {detail}", BAD_RESPONSE
                    )
                code = CONTEXT_LENGTH_EXCEEDED if overflow else f"HTTP_{status}"
                failure = CodedError(f"{self.name}: HTTP {status}: {detail}", code)
                if not (status == 429 or status >= 500) or attempt >= self.retry.max_attempts:
                    raise failure
                delay, cause = self._retry_delay(response, attempt), f"HTTP {status}"
            retried = observe.model_retry
            if retried is not None:
                retried(self.name, cause)
            log.warning(
                "%s: %s on attempt %d of %d; retrying in %.2f s",
                self.name,
                cause,
                attempt,
                self.retry.max_attempts,
                delay,
                extra=context,
            )
            await signal.race(asyncio.sleep(delay))
            attempt += 1

    async def _post(self, body: bytes) -> Response:
        return await self._http.post(self._url, body)

    def _retry_delay(self, response: Response, attempt: int) -> float:
        """The server's wait (capped) on 429 and 503 when it gives one; the backoff otherwise."""
        if response.status in (429, 503):
            seconds = retry_after(response.headers)
            if seconds is not None:
                return min(seconds, self.retry.max_retry_after)
        return self.retry.backoff(attempt)

    async def _error_detail(self, response: Response, signal: AbortSignal) -> tuple[str, bool]:
        """What a failed response's body says, and whether it is a context overflow.

        The detail is the provider's message when it has one.
        """
        try:
            raw = await signal.race(response.read_all(MAX_ERROR_BODY))
        except TransportError:
            raw = b""  # the status says enough
        text = raw.decode("utf-8", errors="replace").strip()
        overflow = response.status == 400 and is_overflow(text)
        detail = error_message(text) or text or response.reason or "no details"
        return self._scrub(detail)[:MAX_ERROR_TEXT], overflow

    def _failure(self, error: CodedError) -> CodedError:
        """`error` named after this provider and scrubbed of the key."""
        message = self._scrub(str(error)).removeprefix(f"{self.name}: ")
        return CodedError(f"{self.name}: {message}", error.code)

    def _scrub(self, text: str) -> str:
        """`text` without the API key, should a server ever echo it."""
        return text.replace(self._api_key, "***") if self._api_key else text


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` in seconds or as an HTTP date.

    None when the headers give no usable wait; a date in the past is a wait of 0.
    """
    try:
        millis = float(headers.get("retry-after-ms", ""))
        if 0 <= millis < float("inf"):
            return millis / 1000
    except ValueError:
        pass
    value = headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None  # not an HTTP date (those are always GMT)
        seconds = max(0.0, when.timestamp() - (time.time() if now is None else now))
    return seconds if 0 <= seconds < float("inf") else None
