"""`agentloop acp` between an ACP client and a real server, all real processes.

The client side is the `agent-client-protocol` package's own (`spawn_agent_process`,
`ClientSideConnection`); the agent is `python -m agentloop.cli acp` as a subprocess;
behind it `python -m server` on a SQLite data directory, restarted on the same port
for the load test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from acp import PROTOCOL_VERSION, Client, RequestError, spawn_agent_process, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AllowedOutcome,
    DeniedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallUpdate,
)
from google.protobuf import json_format

from agentloop import connect
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_pb2, approval_pb2, scripted_pb2
from server.models.scripted_options import script_options
from tests.e2e.registry import eventually
from tests.processes import (
    EXIT_TIMEOUT,
    REPO,
    SERVER_LISTENING,
    free_port,
    read_line,
    server_process,
    token_free_env,
)

STARTUP_BOUND = 30.0
"""How long a server start may take before the test fails (a hang, not a speed check)."""
T = 20.0
"""How long one ACP exchange may take (a turn with a tool call and an approval)."""

COUNT_TEXT = "one two three"


def counting_profile(path: Path) -> Path:
    """A scripted agent that calls `word_count` (which needs approval), then answers."""
    calls = [
        scripted_pb2.ScriptedToolCall(
            id="c1", name="word_count", arguments=json.dumps({"text": COUNT_TEXT})
        )
    ]
    options = agent_pb2.AgentOptions(
        provider="scripted",
        model="m",
        tools=["word_count"],
        approval_required_tools=["word_count"],
        provider_options=script_options(
            [
                scripted_pb2.ScriptedStep(
                    reasoning="Words, then.", text="Let me count.", tool_calls=calls, chunk_size=4
                ),
                scripted_pb2.ScriptedStep(text="Counted them.", chunk_size=4),
            ]
        ),
    )
    path.write_text(json_format.MessageToJson(options))
    return path


class Editor:
    """The client side an editor would be: it records updates and answers permissions."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.permissions: list[tuple[str, ToolCallUpdate, list[PermissionOption]]] = []
        self.answer: Callable[[], Any] = lambda: "allow_once"
        self.asked = asyncio.Event()
        self.changed = asyncio.Event()
        self.release = asyncio.Event()
        """Set to answer a held permission request `cancelled`."""

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append((session_id, update))
        self.changed.set()

    async def until(self, check: Callable[[], bool]) -> None:
        """Wait (bounded) until `check()` holds: notifications are handled as tasks."""
        async with asyncio.timeout(T):
            while not check():
                self.changed.clear()
                await self.changed.wait()

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **_: Any
    ) -> RequestPermissionResponse:
        self.permissions.append((session_id, tool_call, options))
        self.asked.set()
        choice = self.answer()
        if choice == "hold":  # an editor whose user has not answered when the prompt is cancelled
            await self.release.wait()
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=choice)
        )

    def kinds(self) -> list[str]:
        return [u.session_update for _, u in self.updates]

    def text(self, kind: str = "agent_message_chunk") -> str:
        return "".join(u.content.text for _, u in self.updates if u.session_update == kind)

    def tool_updates(self) -> list[Any]:
        return [u for _, u in self.updates if u.session_update in ("tool_call", "tool_call_update")]


@contextlib.asynccontextmanager
async def server(tmp_path: Path, port: int, n: int = 0, mcp: bool = False) -> AsyncIterator[None]:
    """`python -m server` on `port` with its data in `tmp_path/data`.

    With `mcp`, the test toolbox is its MCP server "box" (stdio), connected on return.
    """
    config = tmp_path / "config.yaml"
    settings: dict[str, Any] = {"agents": []}
    if mcp:
        args = ["-m", "tests.mcp_toolbox", "stdio", str(tmp_path)]
        box = {"name": "box", "command": sys.executable, "args": args, "cwd": str(REPO)}
        settings["mcpServers"] = [box]
    config.write_text(json.dumps(settings))  # JSON is YAML
    async with server_process(
        "--config", str(config), "--listen", f"127.0.0.1:{port}",
        "--data-dir", str(tmp_path / "data"), stderr_path=tmp_path / f"server-{n}.stderr",
    ) as process:  # fmt: skip
        # Started at most twice per test, on a machine that may be shared: a wider bound.
        line = await read_line(process.process, STARTUP_BOUND)
        assert SERVER_LISTENING.fullmatch(line), f"{line!r}: {process.log()}"
        if mcp:
            await box_connected(port)
        yield
        assert await process.terminate() == 0, process.log()


async def box_connected(port: int) -> None:
    client = connect(f"127.0.0.1:{port}")

    async def ready() -> bool:
        return [s.state for s in await client.tool_sources()] == [reg.PLUGIN_STATE_READY]

    try:
        await eventually(ready, "the MCP server to connect", seconds=STARTUP_BOUND)
    finally:
        await client.close()


async def resolutions(port: int, session_id: str) -> list[tuple[int, str]]:
    """(outcome, resolved_by) of each `approval_resolved` of the session, as stored."""
    client = connect(f"127.0.0.1:{port}")
    try:
        events = await client.list_events(session_id=session_id)
    finally:
        await client.close()
    return [
        (e.approval_resolved.outcome, e.approval_resolved.resolved_by)
        for e in events
        if e.HasField("approval_resolved")
    ]


@contextlib.asynccontextmanager
async def bridge(
    port: int, profile: Path, editor: Editor, stderr: Path
) -> AsyncIterator[ClientSideConnection]:
    """`agentloop acp` as the editor starts it (stderr to a file), initialized."""
    args = (
        "-m",
        "agentloop.cli",
        "--address",
        f"127.0.0.1:{port}",
        "acp",
        "--profile",
        str(profile),
    )
    with stderr.open("wb") as log:
        spawned = spawn_agent_process(
            cast("Client", editor),  # the SDK routes only the methods a client has
            sys.executable, *args, env=token_free_env(), cwd=REPO,
            transport_kwargs={"stderr": log.fileno(), "shutdown_timeout": EXIT_TIMEOUT},
        )  # fmt: skip
        async with spawned as (conn, process):
            hello = await asyncio.wait_for(conn.initialize(protocol_version=PROTOCOL_VERSION), T)
            assert hello.protocol_version == PROTOCOL_VERSION
            assert hello.agent_capabilities is not None and hello.agent_capabilities.load_session
            yield conn
    assert process.returncode == 0, f"agentloop acp exited {process.returncode}; see {stderr}"


@pytest.fixture
def port() -> int:
    return free_port()


async def test_prompt_streams_text_and_a_tool_call_allowed_once(tmp_path: Path, port: int) -> None:
    editor = Editor()
    async with (
        server(tmp_path, port),
        bridge(
            port, counting_profile(tmp_path / "p.json"), editor, tmp_path / "acp.stderr"
        ) as conn,
    ):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("count these")]), T
        )
        assert answer.stop_reason == "end_turn"
        await editor.until(lambda: editor.text() == "Let me count.Counted them.")
        # Streamed: the script's chunk size is 4, so the text came in pieces.
        assert editor.kinds().count("agent_message_chunk") > 2
        assert editor.text("agent_thought_chunk") == "Words, then."  # reasoning, as thoughts
        assert all(sid == session.session_id for sid, _ in editor.updates)
        # The permission request names the call and offers allow once / reject.
        [(sid, call, options)] = editor.permissions
        assert (sid, call.tool_call_id, call.title, call.status) == (
            session.session_id,
            "c1",
            "word_count",
            "pending",
        )
        assert call.raw_input == {"text": COUNT_TEXT}
        assert [(o.option_id, o.kind) for o in options] == [
            ("allow_once", "allow_once"),
            ("reject_once", "reject_once"),
        ]
        started, finished = editor.tool_updates()
        assert (started.session_update, started.tool_call_id, started.title) == (
            "tool_call",
            "c1",
            "word_count",
        )
        assert (finished.tool_call_id, finished.status) == ("c1", "completed")
        assert finished.content[0].content.text == "3 words"
        # The server records where the person answered: in the editor, through the bridge.
        assert await resolutions(port, session.session_id) == [
            (approval_pb2.APPROVAL_OUTCOME_ALLOWED_ONCE, "api:acp")
        ]


async def test_a_rejected_tool_call_fails_with_the_reason(tmp_path: Path, port: int) -> None:
    editor = Editor()
    editor.answer = lambda: "reject_once"
    async with (
        server(tmp_path, port),
        bridge(
            port, counting_profile(tmp_path / "p.json"), editor, tmp_path / "acp.stderr"
        ) as conn,
    ):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("count these")]), T
        )
        assert answer.stop_reason == "end_turn"
        await editor.until(lambda: len(editor.tool_updates()) == 2)
        finished = editor.tool_updates()[1]
        assert finished.status == "failed"
        assert (
            finished.content[0].content.text
            == 'Error: the user rejected tool "word_count": rejected in the editor'
        )
        assert await resolutions(port, session.session_id) == [
            (approval_pb2.APPROVAL_OUTCOME_REJECTED, "api:acp")
        ]


async def test_cancel_ends_the_prompt_cancelled(tmp_path: Path, port: int) -> None:
    editor = Editor()
    editor.answer = lambda: "hold"
    async with (
        server(tmp_path, port),
        bridge(
            port, counting_profile(tmp_path / "p.json"), editor, tmp_path / "acp.stderr"
        ) as conn,
    ):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        prompt = asyncio.ensure_future(
            conn.prompt(session_id=session.session_id, prompt=[text_block("count these")])
        )
        await asyncio.wait_for(editor.asked.wait(), T)
        await conn.cancel(session_id=session.session_id)
        editor.release.set()  # the spec: the client answers a pending permission `cancelled`
        answer = await asyncio.wait_for(prompt, T)
        assert answer.stop_reason == "cancelled"
        assert "Counted them." not in editor.text()
        # The bridge stays usable: the next prompt runs (the script's next step answers).
        editor.answer = lambda: "allow_once"
        again = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("and now?")]), T
        )
        assert again.stop_reason == "end_turn"
        await editor.until(lambda: editor.text().endswith("Counted them."))


@pytest.mark.timeout(180)  # three server starts and a bridge: slow on a loaded machine
async def test_load_and_prompt_resume_a_session_after_server_restarts(
    tmp_path: Path, port: int
) -> None:
    editor = Editor()
    profile = counting_profile(tmp_path / "p.json")
    async with bridge(port, profile, editor, tmp_path / "acp.stderr") as conn:
        async with server(tmp_path, port, 0):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            answer = await asyncio.wait_for(
                conn.prompt(session_id=sid, prompt=[text_block("count these")]), T
            )
            assert answer.stop_reason == "end_turn"
            await editor.until(lambda: editor.text() == "Let me count.Counted them.")
        editor.updates.clear()
        async with server(tmp_path, port, 1):  # the same bridge process, reconnecting
            await asyncio.wait_for(
                conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[]), T
            )
            # Replayed before the answer: the user's prompt, the messages, the call and its result.
            assert editor.kinds() == [
                "user_message_chunk", "agent_thought_chunk", "agent_message_chunk", "tool_call",
                "tool_call_update",
                "agent_message_chunk",
            ]  # fmt: skip
            assert editor.text("user_message_chunk") == "count these"
            assert editor.text() == "Let me count.Counted them."
            assert editor.tool_updates()[1].content[0].content.text == "3 words"
            editor.updates.clear()
            more = await asyncio.wait_for(
                conn.prompt(session_id=sid, prompt=[text_block("again")]), T
            )
            assert more.stop_reason == "end_turn"
            await editor.until(lambda: editor.text().endswith("Counted them."))
        with pytest.raises(RequestError) as unknown:
            await asyncio.wait_for(
                conn.load_session(cwd=str(tmp_path), session_id="nope", mcp_servers=[]), T
            )
        assert unknown.value.code == -32603  # the server is down: UNAVAILABLE, named
        assert isinstance(unknown.value.data, dict)
        assert unknown.value.data["status"] == "UNAVAILABLE"
        editor.updates.clear()
        async with server(tmp_path, port, 2):  # back again; the editor just prompts
            again = await asyncio.wait_for(
                conn.prompt(session_id=sid, prompt=[text_block("once more")]), T
            )
            assert again.stop_reason == "end_turn"  # resumed by the prompt, then answered
            await editor.until(lambda: editor.text() == "Let me count.Counted them.")
            assert editor.kinds()[0] != "user_message_chunk"  # no replay: not a load


async def test_malformed_messages_get_json_rpc_errors_and_the_bridge_stays_up(
    tmp_path: Path, port: int
) -> None:
    async with server(tmp_path, port):
        with (tmp_path / "acp.stderr").open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agentloop.cli", "--address", f"127.0.0.1:{port}", "acp",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=log, env=token_free_env(), cwd=REPO,
            )  # fmt: skip
        assert process.stdin is not None and process.stdout is not None
        try:
            lines = [
                b"this is not json\n",
                b"[1, 2]\n",
                b'{"jsonrpc": "2.0", "id": 7, "method": 5}\n',
                b'{"jsonrpc": "2.0", "id": 8, "method": "session/prompt", "params": {"nope": 1}}\n',
                b'{"jsonrpc": "2.0", "id": 9, "method": "no/such/method", "params": {}}\n',
                b'{"jsonrpc": "2.0", "id": 10, "method": "session/load", '
                b'"params": {"cwd": "/", "sessionId": "missing", "mcpServers": []}}\n',
                b'{"jsonrpc": "2.0", "id": 11, "method": "initialize", '
                b'"params": {"protocolVersion": 1}}\n',
            ]
            process.stdin.write(b"".join(lines))
            await process.stdin.drain()
            replies: list[dict[str, Any]] = []
            async with asyncio.timeout(T):
                while len(replies) < len(lines):
                    replies.append(json.loads(await process.stdout.readline()))
            by_id = {r["id"]: r for r in replies}
            nulls = [r["error"]["code"] for r in replies if r["id"] is None]
            assert nulls == [-32700, -32600]
            assert by_id[7]["error"]["code"] == -32600
            assert by_id[8]["error"]["code"] == -32602
            assert by_id[9]["error"]["code"] == -32601
            assert by_id[10]["error"]["code"] == -32002
            assert by_id[10]["error"]["data"]["status"] == "NOT_FOUND"
            assert by_id[11]["result"]["protocolVersion"] == PROTOCOL_VERSION
            process.stdin.close()
            async with asyncio.timeout(T):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_tool_progress_shows_as_the_call_s_content_until_its_result(
    tmp_path: Path, port: int
) -> None:
    calls = [
        scripted_pb2.ScriptedToolCall(
            id="s1", name="mcp__box__steps", arguments=json.dumps({"n": 4, "pause": 1.0})
        )
    ]
    options = agent_pb2.AgentOptions(
        provider="scripted", model="m", tools=["mcp:box/*"],
        provider_options=script_options([
            scripted_pb2.ScriptedStep(tool_calls=calls),
            scripted_pb2.ScriptedStep(text="Stepped."),
        ]),
    )  # fmt: skip
    profile = tmp_path / "p.json"
    profile.write_text(json_format.MessageToJson(options))
    editor = Editor()
    async with (
        server(tmp_path, port, mcp=True),
        bridge(port, profile, editor, tmp_path / "acp.stderr") as conn,
    ):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("step")]), T
        )
        assert answer.stop_reason == "end_turn"
        await editor.until(lambda: editor.text() == "Stepped.")
    start, *progress, end = editor.tool_updates()
    assert (start.session_update, start.tool_call_id) == ("tool_call", "s1")
    # Progress is live only: a report made before the bridge's stream subscribed is not
    # seen, nor one after the result. The others show in order, in progress, each the
    # latest report as the call's content, until the result replaces it.
    assert progress and {(u.tool_call_id, u.status) for u in progress} == {("s1", "in_progress")}
    texts = [u.content[0].content.text for u in progress]
    assert all(re.fullmatch(r"([1-4])/4 step \1 of 4 \.+", t) for t in texts), texts
    assert texts == sorted(set(texts))
    assert (end.status, end.content[0].content.text) == ("completed", "4 steps")
