"""The pooled HTTP client of the OpenAI provider: reuse, proxies, Retry-After, framing."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from server.kernel.content import plain_text
from server.kernel.errors import CodedError
from server.models.openai import OpenAIModel, retry_after
from tests.fake_openai import FakeOpenAI, Reply, text
from tests.test_openai_model import assemble, collect, request

OPEN: list[OpenAIModel] = []


@pytest.fixture(autouse=True)
async def close_models() -> AsyncIterator[None]:
    yield
    while OPEN:
        await OPEN.pop().aclose()


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def model(base_url: str, **kwargs: Any) -> OpenAIModel:
    kwargs.setdefault("initial_backoff", 0.01)
    kwargs.setdefault("max_backoff", 0.05)
    made = OpenAIModel(base_url=base_url, default_model="gpt-4o", **kwargs)
    OPEN.append(made)
    return made


async def test_one_connection_serves_every_step(fake: FakeOpenAI, no_proxy_env: Any) -> None:
    fake.script(*(Reply(events=text(f"answer {i}")) for i in range(3)))
    provider = model(fake.base_url)
    for i in range(3):
        assert plain_text(assemble(await collect(provider)).content) == f"answer {i}"
    assert [seen.connection for seen in fake.requests] == [1, 1, 1]
    assert fake.connections == 1


async def test_a_failed_stream_does_not_poison_the_pool(fake: FakeOpenAI, no_proxy_env: Any):
    fake.script(Reply(events=text("a", "b"), cut_after=1), Reply(events=text("fine")))
    provider = model(fake.base_url)
    with pytest.raises(CodedError, match="STREAM_INTERRUPTED|closed before"):
        await collect(provider)
    assert plain_text(assemble(await collect(provider)).content) == "fine"
    assert fake.connections == 2  # the cut connection was dropped, a new one made


async def test_user_agent_is_sent(fake: FakeOpenAI, no_proxy_env: Any) -> None:
    fake.script(Reply(events=text("hi")))
    await collect(model(fake.base_url))
    assert re.fullmatch(r"agentloop/\S+", fake.requests[0].headers["user-agent"])


class CountingProxy:
    """A forwarding HTTP proxy on a real socket that counts the requests it carries."""

    def __init__(self) -> None:
        self.requests = 0
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> CountingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            # A plain-http proxy request names the absolute URL: "POST http://host:port/...".
            first = await reader.readline()
            match = re.match(rb"[A-Z]+ http://([^/:]+):(\d+)(/\S*) ", first)
            if match is None:
                return
            upstream_reader, upstream = await asyncio.open_connection(
                match[1].decode(), int(match[2])
            )
            self.requests += 1
            upstream.write(first)
            await asyncio.gather(
                self._pipe(reader, upstream, count=True),
                self._pipe(upstream_reader, writer, count=False),
            )
        except asyncio.CancelledError:
            pass
        finally:
            for side in (writer, upstream):
                if side is not None:
                    side.transport.abort()

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, count: bool
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                if count:  # later requests on the same kept-alive connection
                    self.requests += len(re.findall(rb"(?m)^POST http://", data))
                dst.write(data)
                await dst.drain()
        if not dst.transport.is_closing():
            dst.write_eof()


async def test_http_proxy_from_the_environment(fake: FakeOpenAI, no_proxy_env: Any) -> None:
    async with CountingProxy() as proxy:
        no_proxy_env.setenv("HTTP_PROXY", proxy.url)
        fake.script(Reply(events=text("via the proxy")), Reply(events=text("again")))
        provider = model(fake.base_url)
        assert plain_text(assemble(await collect(provider)).content) == "via the proxy"
        assert plain_text(assemble(await collect(provider)).content) == "again"
        await provider.aclose()
    assert proxy.requests == 2
    assert len(fake.requests) == 2


async def test_no_proxy_bypasses_it(fake: FakeOpenAI, no_proxy_env: Any) -> None:
    async with CountingProxy() as proxy:
        no_proxy_env.setenv("HTTP_PROXY", proxy.url)
        no_proxy_env.setenv("NO_PROXY", "127.0.0.1")
        fake.script(Reply(events=text("direct")))
        assert plain_text(assemble(await collect(model(fake.base_url))).content) == "direct"
    assert proxy.requests == 0
    assert len(fake.requests) == 1


async def test_retry_after_as_an_http_date(fake: FakeOpenAI, no_proxy_env: Any) -> None:
    declared: list[float] = []

    def two_seconds_on() -> dict[str, str]:
        # Made as the 429 is sent: two seconds on at one-second resolution, an instant 1
        # to 2 s away (the backoff alone would retry within 0.05 s).
        date = email.utils.formatdate(time.time() + 2, usegmt=True)
        declared.append(email.utils.parsedate_to_datetime(date).timestamp())
        return {"Retry-After": date}

    fake.script(
        Reply(status=429, body={"error": {"message": "slow down"}}, headers_at_send=two_seconds_on),
        Reply(events=text("ok")),
    )
    assert plain_text(assemble(await collect(model(fake.base_url))).content) == "ok"
    first, second = fake.requests
    # The retry came at the declared instant or after it, however late the answer was
    # read: the client waited for the date, not for its backoff. (The client waits by the
    # monotonic clock, the fake stamps by the wall clock: a millisecond covers the two.)
    assert second.wall_time >= declared[0] - 0.001, (second.wall_time, declared[0])


async def test_retry_after_ms_is_preferred(fake: FakeOpenAI, no_proxy_env: Any) -> None:
    fake.script(
        Reply(
            status=503,
            body={"error": {"message": "busy"}},
            headers={"retry-after-ms": "400", "Retry-After": "0"},
        ),
        Reply(events=text("ok")),
    )
    assert plain_text(assemble(await collect(model(fake.base_url))).content) == "ok"
    first, second = fake.requests
    assert second.time - first.time >= 0.35


def test_retry_after_parsing() -> None:
    now = 1_700_000_000.0
    assert retry_after({"retry-after": "3"}, now) == 3.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}, now) == 0.25
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after({"retry-after": date}, now) == pytest.approx(30, abs=1)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert retry_after({"retry-after": past}, now) == 0.0
    assert retry_after({"retry-after": "soon"}, now) is None
    assert retry_after({"retry-after": "-1"}, now) is None
    assert retry_after({}, now) is None


@pytest.mark.parametrize(
    ("setting", "model_name", "key"),
    [
        ("auto", "gpt-4o", "max_tokens"),
        ("auto", "o3-mini", "max_completion_tokens"),
        ("auto", "openai/gpt-5", "max_completion_tokens"),
        ("max_completion_tokens", "llama3", "max_completion_tokens"),
        ("max_tokens", "o1", "max_tokens"),
    ],
)
async def test_max_tokens_field(
    fake: FakeOpenAI, no_proxy_env: Any, setting: str, model_name: str, key: str
) -> None:
    fake.script(Reply(events=text("ok")))
    provider = model(fake.base_url, max_tokens_field=setting)
    req = request(max_tokens=64)
    req.header.config.model = model_name
    await collect(provider, req)
    body = fake.requests[0].body
    assert body[key] == 64
    other = {"max_tokens", "max_completion_tokens"} - {key}
    assert not other & body.keys()


# -- framing, through httpx's MockTransport ------------------------------------------------


class Pieces(httpx.AsyncByteStream):
    """A response body given in the pieces listed; an exception in the list is raised."""

    def __init__(self, *pieces: bytes | Exception) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            if isinstance(piece, Exception):
                raise piece
            yield piece


def mocked(*pieces: bytes | Exception) -> OpenAIModel:
    def answer(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Pieces(*pieces)
        )

    made = OpenAIModel(base_url="http://model.test/v1", transport=httpx.MockTransport(answer))
    OPEN.append(made)
    return made


def sse(delta: str = "", finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": delta} if delta else {}, "finish_reason": finish}
    return b"data: " + httpx.Response(200, json={"choices": [choice]}).content + b"\n\n"


async def test_events_split_at_every_byte() -> None:
    body = sse("Hello") + sse(" there") + sse(finish="stop") + b"data: [DONE]\n\n"
    chunks = await collect(mocked(*(body[i : i + 1] for i in range(len(body)))))
    assert plain_text(assemble(chunks).content) == "Hello there"


async def test_a_read_error_mid_body_is_an_interrupted_stream() -> None:
    with pytest.raises(CodedError) as caught:
        await collect(mocked(sse("Hel"), httpx.ReadError("connection reset")))
    assert caught.value.code == "STREAM_INTERRUPTED"


async def test_a_read_timeout_mid_body() -> None:
    with pytest.raises(CodedError) as caught:
        await collect(mocked(sse("Hel"), httpx.ReadTimeout("slow")))
    assert caught.value.code == "TIMEOUT"


async def test_the_body_ending_without_a_finish() -> None:
    with pytest.raises(CodedError) as caught:
        await collect(mocked(sse("Hel")))
    assert caught.value.code == "STREAM_INTERRUPTED"
