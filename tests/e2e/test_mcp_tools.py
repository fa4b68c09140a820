"""MCP servers as tool sources, end to end: a real server, real MCP server processes.

The MCP servers are `tests/mcp_toolbox.py`, written with the `mcp` package's server
side, over stdio (started by the agentloop server) and over Streamable HTTP (started
here, with a bearer token). The scripted model calls their tools; every call goes
through the tool pipeline (opt-in, approvals, parallel slots, cancellation).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.mcp import source
from server.models.scripted_options import script_options
from server.settings.config import Config
from server.settings.mcp_servers import McpOAuthConfig, McpServerConfig
from tests.e2e.conftest import E2E, READ_TIMEOUT, EventStream, running_app
from tests.e2e.registry import eventually
from tests.mcp_oauth import CLIENT_ID, CLIENT_SECRET, TOKEN_SECONDS
from tests.mcp_toolbox import PNG
from tests.processes import REPO, free_port

T = READ_TIMEOUT
STARTUP = 60.0
"""How long MCP server processes may take to start (a hang, not a speed check)."""


def stdio_box(marks: Path, **settings: Any) -> McpServerConfig:
    """The toolbox over stdio, started by the agentloop server, as server "box"."""
    args = ("-m", "tests.mcp_toolbox", "stdio", str(marks))
    return McpServerConfig(name="box", command=sys.executable, args=args, cwd=str(REPO), **settings)


@contextlib.asynccontextmanager
async def serving(
    *servers: McpServerConfig, ready: bool = True, http: bool = False
) -> AsyncIterator[E2E]:
    """A server with these MCP servers; with `ready`, once every one is connected.

    The server itself waits at most 10 s at start for them: a stdio server's start can
    take longer on a loaded machine. With `http`, the HTTP side listens too.
    """
    config = Config(
        listen="127.0.0.1:0", store="memory", agents=(), mcp_servers=servers,
        http_listen="127.0.0.1:0" if http else "",
    )  # fmt: skip
    async with running_app(config) as running:
        if ready:

            async def connected() -> bool:
                return all(s.state == READY for s in await tool_sources(running))

            await eventually(connected, "the MCP servers to connect", seconds=STARTUP)
        yield running


def calling(*calls: tuple[str, dict[str, Any]]) -> scripted_pb2.ScriptedStep:
    """A scripted step calling tools (ids c1, c2, ...)."""
    return scripted_pb2.ScriptedStep(
        tool_calls=[
            scripted_pb2.ScriptedToolCall(id=f"c{i}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(calls, 1)
        ]
    )


def agent(*steps: scripted_pb2.ScriptedStep, tools: tuple[str, ...] = ("mcp:box/*",), **more: Any):
    return agent_pb2.AgentOptions(
        provider="scripted", model="m", provider_options=script_options(list(steps)),
        tools=list(tools), **more,
    )  # fmt: skip


DONE = scripted_pb2.ScriptedStep(text="done")
REGISTRY = "agentloop.plugin.v1.PluginRegistryService"
READY, UNAVAILABLE = reg.PLUGIN_STATE_READY, reg.PLUGIN_STATE_UNAVAILABLE
CONNECTING = reg.PLUGIN_STATE_CONNECTING


async def tool_sources(e2e: E2E) -> list[reg.ToolSource]:
    listed = await e2e.registry.ListToolSources(reg.ListToolSourcesRequest(), timeout=T)
    return list(listed.sources)


async def turn_events(
    e2e: E2E, agent_id: str, text: str = "go", seconds: float = T
) -> list[ev.SessionEvent]:
    turn = await e2e.send(agent_id, text)
    async with asyncio.timeout(seconds):
        return [event async for event in turn]


def results(events: list[ev.SessionEvent]) -> dict[str, ev.ToolResult]:
    return {e.tool_result.call_id: e.tool_result for e in events if e.HasField("tool_result")}


def text(result: ev.ToolResult) -> str:
    return "".join(b.text.text for b in result.content)


def meta(result: ev.ToolResult) -> dict[str, Any]:
    return json_format.MessageToDict(result.meta)["mcp"]  # type: ignore[no-any-return]


async def test_stdio_tools_text_structured_image_and_errors(tmp_path: Path) -> None:
    async with serving(stdio_box(tmp_path)) as e2e:
        step = calling(
            ("mcp__box__echo", {"text": "hi"}),
            ("mcp__box__add", {"a": 1, "b": 2}),
            ("mcp__box__picture", {}),
            ("mcp__box__fail", {}),
            ("mcp__box__echo", {"text": 5}),
        )
        await e2e.create("a", agent(step, DONE))
        found = results(await turn_events(e2e, "a"))
        assert (text(found["c1"]), found["c1"].is_error) == ("echo: hi", False)
        assert (text(found["c2"]), meta(found["c2"])["structuredContent"]) == ("3", {"result": 3})
        picture = found["c3"]
        assert text(picture) == f"[image image/png, {len(PNG)} bytes; kept in the call's meta]"
        [image] = meta(picture)["content"]
        assert (image["type"], image["mimeType"]) == ("image", "image/png")
        assert base64.b64decode(image["data"]) == PNG
        assert found["c4"].is_error and text(found["c4"]) == "Error executing tool fail"
        assert found["c5"].is_error and "Input should be a valid string" in text(found["c5"])


async def test_agents_opt_in_by_name_or_pattern(tmp_path: Path) -> None:
    async with serving(stdio_box(tmp_path)) as e2e:
        step = calling(("mcp__box__echo", {"text": "hi"}), ("mcp__box__add", {"a": 1, "b": 1}))
        await e2e.create("only-echo", agent(step, DONE, tools=("mcp:box/echo",)))
        found = results(await turn_events(e2e, "only-echo"))
        assert text(found["c1"]) == "echo: hi"
        assert found["c2"].is_error and text(found["c2"]) == 'Error: unknown tool "mcp__box__add"'
        await e2e.create("none", agent(step, DONE, tools=()))
        found = results(await turn_events(e2e, "none"))
        assert found["c1"].is_error and found["c2"].is_error
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await e2e.create("bad", agent(DONE, tools=("mcp:other/*",)))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "options.tools" in (refused.value.details() or "")


async def test_read_only_tools_of_a_trusted_server_run_in_parallel(tmp_path: Path) -> None:
    async with serving(stdio_box(tmp_path, trust_annotations=True)) as e2e:
        step = calling(("mcp__box__meet", {"name": "x"}), ("mcp__box__meet", {"name": "y"}))
        await e2e.create("a", agent(step, DONE))
        found = results(await turn_events(e2e, "a"))
        assert (text(found["c1"]), text(found["c2"])) == ("x met", "y met")


async def test_untrusted_annotations_keep_calls_serial(tmp_path: Path) -> None:
    async with serving(stdio_box(tmp_path)) as e2e:
        step = calling(("mcp__box__meet", {"name": "x"}), ("mcp__box__meet", {"name": "y"}))
        await e2e.create("a", agent(step, DONE))
        found = results(await turn_events(e2e, "a"))
        assert text(found["c1"]) == "x waited alone"


async def test_an_mcp_call_waits_for_approval(tmp_path: Path) -> None:
    async with serving(stdio_box(tmp_path)) as e2e:
        step = calling(("mcp__box__echo", {"text": "careful"}))
        await e2e.create("a", agent(step, DONE, approval_required_tools=["mcp__box__echo"]))
        turn = await e2e.send("a", "go")
        events: list[ev.SessionEvent] = []
        async with asyncio.timeout(T):
            async for event in turn:
                events.append(event)
                if event.HasField("approval_requested"):
                    request = event.approval_requested
                    assert request.tool_name == "mcp__box__echo"
                    await e2e.resolve_approval("a", request.approval_id, allow=True)
        assert text(results(events)["c1"]) == "echo: careful"


async def test_cancel_reaches_the_mcp_server(tmp_path: Path) -> None:
    async with serving(stdio_box(tmp_path)) as e2e:
        await e2e.create("a", agent(calling(("mcp__box__slow", {"seconds": 60})), DONE))
        turn = await e2e.send("a", "go")
        await eventually(exists(tmp_path / "slow.started"), "the call to reach the MCP server")
        await e2e.cancel("a", "enough")
        end = await asyncio.wait_for(turn.result(), T)
        assert end.turn_end.reason.WhichOneof("kind") == "aborted"
        await eventually(exists(tmp_path / "slow.cancelled"), "notifications/cancelled")


@pytest.mark.usefixtures("without_tokens")
async def test_a_crash_mid_call_fails_that_call_and_the_server_restarts(tmp_path: Path) -> None:
    async with serving(stdio_box(tmp_path), http=True) as e2e:
        steps = calling(("mcp__box__crash", {})), calling(("mcp__box__echo", {"text": "back"}))
        await e2e.create("a", agent(*steps, DONE))
        events = await turn_events(e2e, "a")
        crashed = [e.tool_result for e in events if e.HasField("tool_result")]
        assert crashed[0].is_error
        assert text(crashed[0]) == (
            'Error: MCP server "box" closed the connection during "crash"; it is being restarted'
        )
        assert (text(crashed[1]), crashed[1].is_error) == ("echo: back", False)
        assert len((tmp_path / "starts").read_text().split()) == 2
        [listed] = await tool_sources(e2e)
        assert (listed.name, listed.transport, listed.state) == ("box", "stdio", READY)
        assert (listed.endpoint, listed.last_error) == (sys.executable, "")
        assert "mcp__box__echo" in listed.tools and "mcp__box__crash" in listed.tools
        assert (listed.restarts, listed.protocol) == (1, "2026-07-28")
        # The HTTP side (what a console reads) carries the same, as protobuf JSON.
        assert e2e.app.http is not None
        url = f"http://127.0.0.1:{e2e.app.http.port}/api/{REGISTRY}/ListToolSources"
        async with httpx.AsyncClient(timeout=T) as client:
            answer = await client.post(url, json={})
        assert answer.status_code == 200
        assert answer.json() == {"sources": [json_format.MessageToDict(listed)]}
        [shown] = answer.json()["sources"]
        assert (shown["state"], shown["restarts"]) == ("PLUGIN_STATE_READY", 1)


async def test_tools_list_changes_reach_the_registry(tmp_path: Path) -> None:
    async with serving(stdio_box(tmp_path)) as e2e:
        steps = calling(("mcp__box__grow", {})), DONE, calling(("mcp__box__grown", {})), DONE
        await e2e.create("a", agent(*steps))
        assert text(results(await turn_events(e2e, "a"))["c1"]) == "grew"

        async def grown() -> bool:
            return "mcp__box__grown" in e2e.app.runtime.tools.names()

        await eventually(grown, "the new tool to be registered")
        assert text(results(await turn_events(e2e, "a"))["c1"]) == "grown here"


def exists(path: Path) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await asyncio.to_thread(path.exists)

    return check


async def wait_listening(port: int) -> None:
    async with asyncio.timeout(T):
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                return
            await asyncio.sleep(0.1)


async def test_streamable_http_with_a_token_and_a_bounded_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    box = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.mcp_toolbox", "http", str(tmp_path), str(port), "s3cret",
        cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await wait_listening(port)
        monkeypatch.setenv("BOX_TOKEN", "s3cret")
        config = McpServerConfig(
            name="web", url=f"http://127.0.0.1:{port}/mcp", token_env="BOX_TOKEN",
            max_result_chars=50,
        )  # fmt: skip
        async with serving(config) as e2e:
            step = calling(("mcp__web__echo", {"text": "over http"}), ("mcp__web__big", {"n": 200}))
            await e2e.create("a", agent(step, DONE, tools=("mcp:web/*",)))
            found = results(await turn_events(e2e, "a"))
            assert text(found["c1"]) == "echo: over http"
            assert text(found["c2"]) == "x" * 50 + (
                "\n[truncated: 50 of 200 characters shown; the result was over the limit]"
            )
    finally:
        box.kill()
        await box.wait()


async def test_a_wrong_token_leaves_the_server_down_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    box = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.mcp_toolbox", "http", str(tmp_path), str(port), "s3cret",
        cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await wait_listening(port)
        monkeypatch.setenv("BOX_TOKEN", "wrong")
        config = McpServerConfig(
            name="web", url=f"http://127.0.0.1:{port}/mcp", token_env="BOX_TOKEN",
            connect_timeout_seconds=0.5,
        )  # fmt: skip
        async with serving(config, ready=False) as e2e:
            [listed] = await tool_sources(e2e)
            assert (listed.name, listed.transport) == ("web", "streamable-http")
            assert listed.state in (UNAVAILABLE, CONNECTING) and list(listed.tools) == []
            assert "(HTTP 401)" in listed.last_error
    finally:
        box.kill()
        await box.wait()


async def start_http_box(marks: Path, port: int) -> asyncio.subprocess.Process:
    box = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.mcp_toolbox", "http", str(marks), str(port),
        cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await wait_listening(port)
    return box


async def test_an_http_server_that_dies_mid_call_fails_that_call_and_is_reconnected(
    tmp_path: Path,
) -> None:
    port = free_port()
    box = await start_http_box(tmp_path, port)
    try:
        config = McpServerConfig(name="web", url=f"http://127.0.0.1:{port}/mcp")
        async with serving(config) as e2e:
            await e2e.create(
                "a", agent(calling(("mcp__web__crash", {})), DONE, tools=("mcp:web/*",))
            )
            [crashed] = results(await turn_events(e2e, "a")).values()
            assert crashed.is_error and 'MCP server "web"' in text(crashed)
            assert await box.wait() == 3
            box = await start_http_box(tmp_path, port)  # the server comes back
            await e2e.create(
                "b",
                agent(calling(("mcp__web__echo", {"text": "again"})), DONE, tools=("mcp:web/*",)),
            )
            [echoed] = results(await turn_events(e2e, "b")).values()
            assert (text(echoed), echoed.is_error) == ("echo: again", False)
    finally:
        if box.returncode is None:
            box.kill()
        await box.wait()


async def test_a_call_past_its_timeout_fails_alone_and_is_cancelled_at_the_server(
    tmp_path: Path,
) -> None:
    async with serving(stdio_box(tmp_path, timeout_seconds=1.0)) as e2e:
        steps = (
            calling(("mcp__box__slow", {"seconds": 60})),
            calling(("mcp__box__echo", {"text": "next"})),
        )
        await e2e.create("a", agent(*steps, DONE))
        events = await turn_events(e2e, "a")
        late, after = (e.tool_result for e in events if e.HasField("tool_result"))
        assert late.is_error
        assert text(late) == 'Error: MCP server "box": "slow" timed out after 1 s and was cancelled'
        assert (text(after), after.is_error) == ("echo: next", False)
        await eventually(exists(tmp_path / "slow.cancelled"), "notifications/cancelled")
        # The server answered the health check that followed: slow, not hung, it stays.
        assert len((tmp_path / "starts").read_text().split()) == 1
        [listed] = await tool_sources(e2e)
        assert (listed.state, listed.restarts) == (READY, 0)


async def test_a_hung_server_fails_the_call_alone_is_restarted_and_logs_its_stderr(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="server.mcp.stderr")
    box = stdio_box(
        tmp_path, timeout_seconds=2.0, health_timeout_seconds=2.0, connect_timeout_seconds=STARTUP
    )
    async with serving(box) as e2e:
        steps = (
            calling(("mcp__box__hang", {})),  # the whole server stops answering
            calling(("mcp__box__echo", {"text": "back"})),
        )
        await e2e.create("a", agent(*steps, DONE))
        # A hang, a check, the process ended, a new one started: bounded, not timed.
        events = await turn_events(e2e, "a", seconds=STARTUP)
        hung, after = (e.tool_result for e in events if e.HasField("tool_result"))
        assert hung.is_error
        assert text(hung) == 'Error: MCP server "box": "hang" timed out after 2 s and was cancelled'
        # The next call waited for the unanswered health check, then for the restart.
        assert (text(after), after.is_error) == ("echo: back", False)
        first, second, *_ = (tmp_path / "starts").read_text().split()
        [listed] = await tool_sources(e2e)
        assert (listed.state, listed.last_error) == (READY, "")
        assert listed.restarts >= 1 and listed.protocol == "2026-07-28"
        assert "no answer to a health check within 2 s" in caplog.text
        lines = [r.getMessage() for r in caplog.records if r.name == "server.mcp.stderr"]
        for pid in (first, second):
            assert f"MCP server box stderr: toolbox {pid} starting" in lines


async def test_progress_notifications_reach_live_observers_bounded(tmp_path: Path) -> None:
    async with serving(stdio_box(tmp_path)) as e2e:
        step = calling(
            ("mcp__box__steps", {"n": 3, "pause": 0.3}),
            ("mcp__box__steps", {"n": 100, "pause": 0}),  # a burst: bounded, the last shows
        )
        await e2e.create("a", agent(step, DONE))
        with EventStream(e2e.agents, agent_id="a") as stream:
            await e2e.send("a", "go")
            await stream.until("turn_end")
        found = results(stream.events)
        assert (text(found["c1"]), text(found["c2"])) == ("3 steps", "100 steps")
        progress = [e.tool_progress for e in stream.agent_events if e.HasField("tool_progress")]
        spaced = [p for p in progress if p.tool_call_id == "c1"]
        # The first report and the one reaching the total always show, in order.
        assert (spaced[0].progress, spaced[-1].progress) == (1, 3)
        assert {p.total for p in spaced} == {3}
        assert [p.progress for p in spaced] == sorted({p.progress for p in spaced})
        first = spaced[0]
        assert (first.tool_name, first.turn, first.step) == ("mcp__box__steps", 1, 1)
        assert first.message == ("step 1 of 3 " + "." * 300)[:200]
        burst = [p for p in progress if p.tool_call_id == "c2"]
        assert burst[0].progress == 1 and (burst[-1].progress, burst[-1].total) == (100, 100)
        assert len(burst) < 50  # at most 5 a second: the burst's others were dropped
        # Live only: nothing of it is in the session log.
        assert not [e for e in stream.events if "progress" in (e.WhichOneof("payload") or "")]


async def test_an_older_server_s_list_changed_notification_reaches_the_registry(
    tmp_path: Path,
) -> None:
    async with serving(stdio_box(tmp_path, protocol="legacy", refresh_seconds=3600)) as e2e:
        [listed] = await tool_sources(e2e)
        assert listed.protocol and listed.protocol < "2026"  # the initialize handshake
        await e2e.create("a", agent(calling(("mcp__box__grow", {})), DONE))
        assert text(results(await turn_events(e2e, "a"))["c1"]) == "grew"

        async def grown() -> bool:
            return "mcp__box__grown" in e2e.app.runtime.tools.names()

        await eventually(grown, "notifications/tools/list_changed to re-list the tools")


async def start_oauth_box(marks: Path, port: int) -> asyncio.subprocess.Process:
    box = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.mcp_toolbox", "oauth", str(marks), str(port),
        cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await wait_listening(port)
    return box


def oauth_box(port: int, secret_env: str = "BOX_SECRET", **settings: Any) -> McpServerConfig:
    oauth = McpOAuthConfig(
        client_id=CLIENT_ID, client_secret_env=secret_env, issuer=f"http://127.0.0.1:{port}"
    )
    return McpServerConfig(name="web", url=f"http://127.0.0.1:{port}/mcp", oauth=oauth, **settings)


async def test_oauth_client_credentials_get_a_token_and_a_new_one_when_it_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    box = await start_oauth_box(tmp_path, port)
    try:
        monkeypatch.setenv("BOX_SECRET", CLIENT_SECRET)
        async with serving(oauth_box(port)) as e2e:
            [listed] = await tool_sources(e2e)
            assert (listed.state, listed.last_error) == (READY, "")
            assert "mcp__web__echo" in listed.tools
            step = calling(("mcp__web__echo", {"text": "with a token"}))
            await e2e.create("a", agent(step, DONE, step, DONE, tools=("mcp:web/*",)))
            [echoed] = results(await turn_events(e2e, "a")).values()
            assert (text(echoed), echoed.is_error) == ("echo: with a token", False)
            issued = (tmp_path / "tokens").read_text().split()
            await asyncio.sleep(TOKEN_SECONDS + 0.5)  # the token expires
            [echoed] = results(await turn_events(e2e, "a")).values()
            assert (text(echoed), echoed.is_error) == ("echo: with a token", False)
            assert len((tmp_path / "tokens").read_text().split()) > len(issued)
    finally:
        box.kill()
        await box.wait()


async def test_oauth_with_a_wrong_secret_leaves_the_server_down_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    box = await start_oauth_box(tmp_path, port)
    try:
        monkeypatch.setenv("BOX_SECRET", "wrong")
        async with serving(oauth_box(port, connect_timeout_seconds=0.5), ready=False) as e2e:
            [listed] = await tool_sources(e2e)
            assert listed.state in (UNAVAILABLE, CONNECTING) and list(listed.tools) == []
            assert listed.last_error
            assert not (tmp_path / "tokens").exists()
    finally:
        box.kill()
        await box.wait()


async def test_a_hung_http_server_fails_calls_fast_and_each_attempt_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source, "HANDSHAKE_SECONDS", 2.0)
    port = free_port()
    box = await start_http_box(tmp_path, port)
    try:
        config = McpServerConfig(
            name="web", url=f"http://127.0.0.1:{port}/mcp", timeout_seconds=2.0,
            health_timeout_seconds=2.0, connect_timeout_seconds=1.0,
        )  # fmt: skip
        async with serving(config) as e2e:
            steps = calling(("mcp__web__hang", {})), calling(("mcp__web__echo", {"text": "x"}))
            await e2e.create("a", agent(*steps, DONE, tools=("mcp:web/*",)))
            events = await turn_events(e2e, "a", seconds=STARTUP)
            hung, after = (e.tool_result for e in events if e.HasField("tool_result"))
            assert (
                text(hung)
                == 'Error: MCP server "web": "hang" timed out after 2 s and was cancelled'
            )
            # The server is not ours to restart: the next call fails on the reason, fast.
            assert after.is_error
            assert text(after).startswith('Error: MCP server "web" is not connected: no answer')
            assert text(after).endswith("; it is being restarted")

            async def given_up() -> bool:
                [listed] = await tool_sources(e2e)
                return "no answer to the handshake" in listed.last_error

            await eventually(given_up, "a connection attempt to be given up", seconds=STARTUP)
    finally:
        box.kill()
        await box.wait()
