"""The HTTP side (`httpListen`): the API as JSON and server-sent events, against a real
server, checked to answer every call as the gRPC API does: the same statuses (code,
message, details) under mapped HTTP codes, the same limits, the same token (from the
`Authorization` header only), and TLS with the listener's certificate."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2  # type: ignore[import-untyped]

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, approval_pb2
from agentloop.v1 import agent_service_pb2 as api
from server.edge.app import App
from server.edge.http_answers import HTTP_CODES
from server.kernel.limits import Limits
from server.settings.config import Config, ConfigError
from tests.e2e.conftest import E2E, READ_TIMEOUT, running_app
from tests.e2e.test_server_tls import TOKEN as TLS_TOKEN
from tests.e2e.test_server_tls import Pki, pki, tls_config

__all__ = ["pki"]  # the fixture, used by name

T = READ_TIMEOUT
TOKEN = "http-side-token"
FACTORY = "/api/agentloop.v1.AgentFactoryService"
AGENTS = "/api/agentloop.v1.AgentService"
JSON = {"Content-Type": "application/json"}
RIGHT = {**JSON, "Authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.usefixtures("without_tokens")


@contextlib.asynccontextmanager
async def http_app(config: Config) -> AsyncIterator[tuple[E2E, httpx.AsyncClient]]:
    """A server with the HTTP side on 127.0.0.1:0, and an HTTP client of it."""
    async with running_app(replace(config, http_listen="127.0.0.1:0")) as e2e:
        assert e2e.app.http is not None
        base = f"http://127.0.0.1:{e2e.app.http.port}"
        async with httpx.AsyncClient(base_url=base, timeout=T) as client:
            yield e2e, client


@pytest.fixture
async def side() -> AsyncIterator[tuple[E2E, httpx.AsyncClient]]:
    """A server without a token, its HTTP side and a client."""
    async with http_app(Config(listen="127.0.0.1:0", store="memory", agents=())) as pair:
        yield pair


def grpc_status(error: grpc.aio.AioRpcError) -> dict[str, Any]:
    """The status of a failed gRPC call as the HTTP side writes it."""
    status = status_pb2.Status(code=error.code().value[0], message=error.details() or "")
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
    body: dict[str, Any] = {"status": error.code().name}
    body.update(json_format.MessageToDict(status, always_print_fields_with_no_presence=True))
    return body


async def over_grpc(e2e: E2E, path: str, request: Any, response: Any) -> dict[str, Any]:
    """Call a unary method over gRPC; its status as JSON ({} when it succeeds)."""
    call = e2e.channel.unary_unary(
        path, request_serializer=type(request).SerializeToString,
        response_deserializer=response.FromString,
    )  # fmt: skip
    try:
        await call(request, timeout=T)
    except grpc.aio.AioRpcError as error:
        return grpc_status(error)
    return {}


REFUSALS = [
    pytest.param(
        "AgentService/SendMessage", api.SendMessageRequest(agent_id="ghost", text="hi"),
        api.SendMessageResponse, "NOT_FOUND", id="unknown-agent",
    ),
    pytest.param(
        "AgentFactoryService/CreateAgent", fac.CreateAgentRequest(agent_id="bad id!"),
        fac.CreateAgentResponse, "INVALID_ARGUMENT", id="bad-field",
    ),
    pytest.param(
        "AgentFactoryService/CreateAgent",
        fac.CreateAgentRequest(agent_id="x", options=agent_pb2.AgentOptions(tools=["nope"])),
        fac.CreateAgentResponse, "INVALID_ARGUMENT", id="unknown-tool",
    ),
    pytest.param(
        "AgentFactoryService/CreateAgent", fac.CreateAgentRequest(agent_id="taken"),
        fac.CreateAgentResponse, "ALREADY_EXISTS", id="taken-id",
    ),
    pytest.param(
        "AgentService/ListSessionEvents",
        api.ListSessionEventsRequest(agent_id="taken", page_size=100_000),
        api.ListSessionEventsResponse, "INVALID_ARGUMENT", id="page-size",
    ),
    pytest.param(
        "AgentService/SendMessage", api.SendMessageRequest(agent_id="taken", text="x" * 1_100_000),
        api.SendMessageResponse, "INVALID_ARGUMENT", id="max-content-bytes",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("method", "request_message", "response", "code"), REFUSALS)
async def test_a_refusal_is_the_grpc_status_under_the_mapped_http_code(
    side: tuple[E2E, httpx.AsyncClient], method: str, request_message: Any, response: Any, code: str
) -> None:
    e2e, client = side
    await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="taken"), timeout=T)
    expected = await over_grpc(e2e, f"/agentloop.v1.{method}", request_message, response)
    assert expected["status"] == code
    answer = await client.post(
        f"/api/agentloop.v1.{method}",
        headers=JSON,
        content=json_format.MessageToJson(request_message),
    )
    assert answer.status_code == HTTP_CODES[getattr(grpc.StatusCode, code)]
    assert answer.json() == expected
    assert answer.json()["details"], "the details (ErrorInfo, BadRequest) are carried"


async def test_a_turn_over_json_and_server_sent_events(side: tuple[E2E, httpx.AsyncClient]) -> None:
    e2e, client = side
    created = await client.post(
        f"{FACTORY}/CreateAgent", headers=JSON,
        json={"agentId": "web", "options": {"tools": ["word_count"]}},
    )  # fmt: skip
    assert created.status_code == 200, created.text
    assert created.json()["agent"]["agentId"] == "web"
    sent = await client.post(
        f"{AGENTS}/SendMessage", headers=JSON, json={"agentId": "web", "text": "three words here"}
    )
    assert sent.status_code == 200
    next_seq = int(sent.json()["nextSeq"])
    messages: list[dict[str, Any]] = []
    ids: list[str] = []
    async with client.stream(
        "POST", f"{AGENTS}/StreamSessionEvents", headers=JSON,
        json={"agentId": "web", "fromSeq": next_seq},
    ) as stream:  # fmt: skip
        assert stream.status_code == 200
        assert stream.headers["content-type"] == "text/event-stream"
        kind = ""
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("id: "):
                ids.append(line[4:])
            elif line.startswith("data: "):
                assert kind == "message"
                messages.append(json.loads(line[6:]))
                events = messages[-1].get("events", [])
                if any("turnEnd" in event for event in events):
                    break
    assert messages[0] == {"subscribed": True}
    events = [event for message in messages for event in message.get("events", [])]
    assert [int(e["seq"]) for e in events] == list(range(next_seq, next_seq + len(events)))
    assert ids and ids[-1] == events[-1]["seq"]  # the SSE id: the last seq it carried
    assert events[-1]["turnEnd"]["reason"] == {"completed": {}}
    (call,) = [e["toolCall"] for e in events if "toolCall" in e]
    assert call["name"] == "word_count"
    # The JSON is the gRPC answer, in the protobuf JSON mapping.
    listed = await e2e.agents.ListSessionEvents(
        api.ListSessionEventsRequest(agent_id="web", page_size=1000), timeout=T
    )
    assert [json_format.MessageToDict(e) for e in listed.events][next_seq - 1 :] == events


async def test_a_stream_refused_at_once_is_an_http_status(
    side: tuple[E2E, httpx.AsyncClient],
) -> None:
    e2e, client = side
    await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="short"), timeout=T)
    answer = await client.post(
        f"{AGENTS}/StreamSessionEvents", headers=JSON, json={"agentId": "short", "fromSeq": 99}
    )
    assert answer.status_code == 400
    assert answer.json()["status"] == "OUT_OF_RANGE"
    missing = await client.post(
        f"{AGENTS}/StreamSessionEvents", headers=JSON, json={"agentId": "x"}
    )
    assert (missing.status_code, missing.json()["status"]) == (404, "NOT_FOUND")


async def test_the_stream_limit_holds_over_http() -> None:
    config = Config(listen="127.0.0.1:0", store="memory", agents=(), limits=Limits(max_streams=1))
    async with http_app(config) as (e2e, client):
        await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="a"), timeout=T)
        body = {"agentId": "a", "fromSeq": 1}
        async with client.stream(
            "POST", f"{AGENTS}/StreamSessionEvents", headers=JSON, json=body
        ) as first:
            assert first.status_code == 200
            second = await client.post(f"{AGENTS}/StreamSessionEvents", headers=JSON, json=body)
            assert second.status_code == 429
            assert second.json()["status"] == "RESOURCE_EXHAUSTED"
            assert "limits.maxStreams (1)" in second.json()["message"]
        # Closing the HTTP stream ends its gRPC stream: the slot is free again.
        for _ in range(int(T / 0.01)):  # bounded: at most T seconds
            if not e2e.app.guard.streams:
                break
            await asyncio.sleep(0.01)
        assert e2e.app.guard.streams == 0
        async with client.stream(
            "POST", f"{AGENTS}/StreamSessionEvents", headers=JSON, json=body
        ) as again:
            assert again.status_code == 200


async def test_the_request_size_limit_holds_over_http() -> None:
    limits = Limits(max_request_bytes=64 * 1024, max_content_bytes=1024 * 1024)
    config = Config(listen="127.0.0.1:0", store="memory", agents=(), limits=limits)
    async with http_app(config) as (e2e, client):
        await e2e.factory.CreateAgent(fac.CreateAgentRequest(agent_id="a"), timeout=T)
        request = api.SendMessageRequest(agent_id="a", text="y" * 100_000)
        expected = await over_grpc(
            e2e, "/agentloop.v1.AgentService/SendMessage", request, api.SendMessageResponse
        )
        assert expected["status"] == "RESOURCE_EXHAUSTED"
        answer = await client.post(
            f"{AGENTS}/SendMessage", headers=JSON, content=json_format.MessageToJson(request)
        )
        assert (answer.status_code, answer.json()["status"]) == (429, "RESOURCE_EXHAUSTED")
        huge = await client.post(f"{AGENTS}/SendMessage", headers=JSON, content=b" " * 400_000)
        assert (huge.status_code, huge.json()["status"]) == (429, "RESOURCE_EXHAUSTED")


@pytest.fixture
async def secured(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[E2E, httpx.AsyncClient]]:
    """A server requiring TOKEN, its HTTP side and a client."""
    monkeypatch.setenv("AGENTLOOP_TOKEN", TOKEN)
    async with http_app(Config(listen="127.0.0.1:0", store="memory", agents=())) as pair:
        yield pair


@pytest.mark.parametrize(
    ("headers", "why"),
    [(JSON, "missing token"), ({**JSON, "Authorization": "Bearer nope"}, "wrong token")],
    ids=["none", "wrong"],
)
async def test_the_token_is_required_as_over_grpc(
    secured: tuple[E2E, httpx.AsyncClient], headers: dict[str, str], why: str
) -> None:
    _, client = secured
    for path, body in [
        (f"{FACTORY}/ListAgents", "{}"),
        (f"{AGENTS}/SendMessage", '{"agentId": "ghost"}'),
        (f"{AGENTS}/SendMessage", '{"notAField": 1'),  # a bad body says nothing either
        (f"{AGENTS}/StreamSessionEvents", '{"agentId": "ghost"}'),
    ]:
        answer = await client.post(path, headers=headers, content=body)
        assert answer.status_code == 401, (path, answer.text)
        assert answer.json()["status"] == "UNAUTHENTICATED"
        assert answer.json()["message"].startswith(why)


async def test_the_token_counts_only_in_the_header(
    secured: tuple[E2E, httpx.AsyncClient],
) -> None:
    _, client = secured
    for query in (f"?token={TOKEN}", f"?authorization=Bearer%20{TOKEN}", f"?access_token={TOKEN}"):
        answer = await client.post(f"{FACTORY}/ListAgents{query}", headers=JSON, content="{}")
        assert answer.status_code == 401, query
    right = await client.post(f"{FACTORY}/ListAgents", headers=RIGHT, content="{}")
    assert (right.status_code, right.json()) == (200, {})
    bad = await client.post(f"{AGENTS}/SendMessage", headers=RIGHT, content='{"agentIdx": "a"}')
    assert bad.status_code == 400
    assert bad.json()["status"] == "INVALID_ARGUMENT"
    assert "agentIdx" in bad.json()["message"]
    assert bad.json()["details"][0]["reason"] == "MALFORMED_REQUEST"


async def test_what_is_not_an_api_call(side: tuple[E2E, httpx.AsyncClient]) -> None:
    _, client = side
    page = await client.get("/")
    assert page.status_code == 200
    assert "<title>agentloop console</title>" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    script = await client.get("/console/app.js")
    assert script.status_code == 200
    assert "javascript" in script.headers["content-type"]
    form = await client.post(
        f"{FACTORY}/ListAgents", content="{}", headers={"Content-Type": "text/plain"}
    )
    assert (form.status_code, form.json()["status"]) == (400, "INVALID_ARGUMENT")
    got = await client.get(f"{FACTORY}/ListAgents")
    assert got.status_code == 405
    unknown = await client.post(f"{FACTORY}/Nope", headers=JSON, content="{}")
    assert (unknown.status_code, unknown.json()["status"]) == (501, "UNIMPLEMENTED")


async def test_the_http_side_serves_tls_with_the_listener_certificate(
    pki: Pki, tmp_path: Path
) -> None:
    config = replace(tls_config(pki, tmp_path, mutual=False), http_listen="127.0.0.1:0")
    app = App(config)
    await app.start()
    try:
        assert app.http is not None
        trusted = ssl.create_default_context(cafile=str(pki.ca))
        async with httpx.AsyncClient(verify=trusted, timeout=T) as client:
            url = f"https://127.0.0.1:{app.http.port}{FACTORY}/ListAgents"
            answer = await client.post(
                url, headers={**JSON, "Authorization": f"Bearer {TLS_TOKEN}"}, content="{}"
            )
            assert (answer.status_code, answer.json()) == (200, {})
        async with httpx.AsyncClient(timeout=T) as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.post(url.replace("https:", "http:"), headers=JSON, content="{}")
    finally:
        await app.stop(grace=0)


def test_http_listen_beyond_loopback_needs_tls_and_a_token() -> None:
    config = Config(listen="127.0.0.1:0", http_listen="0.0.0.0:8080", store="memory")
    with pytest.raises(ConfigError, match=r"^httpListen: 0\.0\.0\.0:8080 is reachable"):
        App(config)


async def test_an_open_event_stream_ends_when_the_server_stops() -> None:
    config = Config(listen="127.0.0.1:0", http_listen="127.0.0.1:0", store="memory", agents=())
    app = App(config)
    await app.start()
    stopped = False
    try:
        assert app.http is not None
        await app.factory.create("a", agent_pb2.AgentOptions())
        base = f"http://127.0.0.1:{app.http.port}"
        async with (
            httpx.AsyncClient(base_url=base, timeout=T) as client,
            client.stream(
                "POST", f"{AGENTS}/StreamSessionEvents", headers=JSON, json={"agentId": "a"}
            ) as stream,
        ):
            assert stream.status_code == 200
            lines = stream.aiter_lines()
            assert await anext(lines) == "event: message"
            stopping = asyncio.ensure_future(app.stop(grace=0))
            rest = [line async for line in lines]  # ends: the server closed the stream
            await asyncio.wait_for(stopping, T)
            stopped = True
            # The disposal of the agent came first, then the stream's end.
            assert any('"disposed":{}' in line for line in rest), rest
            assert rest[-3:] == ["event: end", "data: {}", ""], rest
    finally:
        if not stopped:
            await app.stop(grace=0)


async def test_without_a_token_only_this_machine_names_may_call(
    side: tuple[E2E, httpx.AsyncClient],
) -> None:
    _, client = side
    port = client.base_url.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        answer = await client.post(
            f"{FACTORY}/ListAgents", headers={**JSON, "Host": host}, content="{}"
        )
        assert answer.status_code == 200, host
    rebound = await client.post(
        f"{FACTORY}/ListAgents", headers={**JSON, "Host": f"evil.example:{port}"}, content="{}"
    )
    assert (rebound.status_code, rebound.json()["status"]) == (403, "PERMISSION_DENIED")
    assert rebound.json()["details"][0]["reason"] == "FOREIGN_HOST"
    page = await client.get("/", headers={"Host": "evil.example"})
    assert page.status_code == 403


async def test_with_a_token_any_host_name_may_call(secured: tuple[E2E, httpx.AsyncClient]) -> None:
    _, client = secured
    answer = await client.post(
        f"{FACTORY}/ListAgents", headers={**RIGHT, "Host": "console.example"}, content="{}"
    )
    assert answer.status_code == 200


async def test_a_taken_http_port_stops_the_start() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        port = holder.getsockname()[1]
        config = Config(
            listen="127.0.0.1:0", http_listen=f"127.0.0.1:{port}", store="memory", agents=()
        )
        app = App(config)
        with pytest.raises(OSError):
            await app.start()
        await app.stop(grace=0)
    finally:
        holder.close()


async def test_the_http_side_asks_for_client_certificates_as_the_listener_does(
    pki: Pki, tmp_path: Path
) -> None:
    config = replace(tls_config(pki, tmp_path, mutual=True), http_listen="127.0.0.1:0")
    app = App(config)
    await app.start()
    try:
        assert app.http is not None
        url = f"https://127.0.0.1:{app.http.port}{FACTORY}/ListAgents"
        headers = {**JSON, "Authorization": f"Bearer {TLS_TOKEN}"}
        anonymous = ssl.create_default_context(cafile=str(pki.ca))
        async with httpx.AsyncClient(verify=anonymous, timeout=T) as client:
            with pytest.raises(httpx.HTTPError):  # no client certificate: no handshake
                await client.post(url, headers=headers, content="{}")
        known = ssl.create_default_context(cafile=str(pki.ca))
        known.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        async with httpx.AsyncClient(verify=known, timeout=T) as client:
            answer = await client.post(url, headers=headers, content="{}")
            assert (answer.status_code, answer.json()) == (200, {})
    finally:
        await app.stop(grace=0)


async def test_resolve_approval_over_json_answers_as_over_grpc(
    side: tuple[E2E, httpx.AsyncClient],
) -> None:
    """ResolveApproval over JSON: the answer, and the refusals (a wrong id, a second answer)
    with the gRPC status under the mapped HTTP code, as the console shows them."""
    e2e, client = side
    options = {"tools": ["word_count"], "approvalRequiredTools": ["word_count"]}
    created = await client.post(
        f"{FACTORY}/CreateAgent", headers=JSON, json={"agentId": "ask", "options": options}
    )
    assert created.status_code == 200, created.text
    sent = await client.post(
        f"{AGENTS}/SendMessage", headers=JSON, json={"agentId": "ask", "text": "three words here"}
    )
    assert sent.status_code == 200, sent.text
    requested: dict[str, Any] = {}
    async with client.stream(
        "POST", f"{AGENTS}/StreamSessionEvents", headers=JSON,
        json={"agentId": "ask", "fromSeq": int(sent.json()["nextSeq"])},
    ) as stream:  # fmt: skip
        async for line in stream.aiter_lines():
            if line.startswith("data: "):
                events = json.loads(line[6:]).get("events", [])
                found = [e["approvalRequested"] for e in events if "approvalRequested" in e]
                if found:
                    requested = found[0]
                    break
    assert requested["toolName"] == "word_count"
    listed = await client.post(f"{AGENTS}/ListApprovals", headers=JSON, json={"agentId": "ask"})
    assert listed.json() == {"approvals": [requested]}

    async def both(request: api.ResolveApprovalRequest, code: str) -> None:
        expected = await over_grpc(
            e2e, "/agentloop.v1.AgentService/ResolveApproval", request, api.ResolveApprovalResponse
        )
        assert expected["status"] == code
        answer = await client.post(
            f"{AGENTS}/ResolveApproval", headers=JSON, content=json_format.MessageToJson(request)
        )
        assert answer.status_code == HTTP_CODES[getattr(grpc.StatusCode, code)]
        assert answer.json() == expected

    allow = approval_pb2.APPROVAL_DECISION_ALLOW_ONCE
    wrong = api.ResolveApprovalRequest(agent_id="ask", approval_id="no-such-id", decision=allow)
    await both(wrong, "NOT_FOUND")
    answer = await client.post(
        f"{AGENTS}/ResolveApproval", headers=JSON,
        json={"agentId": "ask", "approvalId": requested["approvalId"],
              "decision": "APPROVAL_DECISION_ALLOW_ONCE"},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    resolution = answer.json()["resolution"]
    assert (resolution["outcome"], resolution["resolvedBy"]) == (
        "APPROVAL_OUTCOME_ALLOWED_ONCE",
        "api",
    )
    twice = api.ResolveApprovalRequest(
        agent_id="ask", approval_id=requested["approvalId"], decision=allow
    )
    await both(twice, "FAILED_PRECONDITION")
    assert HTTP_CODES[grpc.StatusCode.FAILED_PRECONDITION] in (400, 409)
    listed = await client.post(f"{AGENTS}/ListApprovals", headers=JSON, json={"agentId": "ask"})
    assert listed.json() == {}
