"""An MCP server for the tests, written with the `mcp` package's own server side.

    python -m tests.mcp_toolbox stdio DIR
    python -m tests.mcp_toolbox http DIR PORT [TOKEN]
    python -m tests.mcp_toolbox oauth DIR PORT

DIR receives marker files the tests wait on (`slow.started`, `slow.cancelled`,
`hang.started`, `starts`: one line per process start). Over HTTP, a TOKEN makes every
request need `Authorization: Bearer TOKEN` (401 otherwise); `oauth` serves the tools
as an OAuth-protected resource and, on the same port, the authorization server that
issues its tokens (`tests/mcp_oauth.py`). Each start says so on stderr.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp_types import ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
"""A 1x1 PNG."""

READ_ONLY = ToolAnnotations(read_only_hint=True)


def build(marks: Path, **settings: Any) -> MCPServer:
    """The toolbox: echo, add, picture, slow, hang, crash, fail, big, meet, grow, steps."""
    server: MCPServer = MCPServer("toolbox", **settings)
    arrivals: list[asyncio.Event] = []

    @server.tool(description="Echoes the text back.")
    def echo(text: str) -> str:
        return f"echo: {text}"

    @server.tool(description="Adds two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="A tiny picture.")
    def picture() -> Image:
        return Image(data=PNG, format="png")

    @server.tool(description="Sleeps, marking when it starts and when it is cancelled.")
    async def slow(seconds: float) -> str:
        (marks / "slow.started").write_text("started")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            (marks / "slow.cancelled").write_text("cancelled")
            raise
        return "slept"

    @server.tool(description="Hangs the whole server: it answers nothing more, pings included.")
    async def hang() -> str:
        (marks / "hang.started").write_text("started")
        time.sleep(3600)  # noqa: ASYNC251  (it blocks the event loop on purpose)
        return "woke"

    @server.tool(description="Reports progress n times (a pause in between), then answers.")
    async def steps(n: int, pause: float, ctx: Context) -> str:
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"step {i} of {n} " + "." * 300)
            await asyncio.sleep(pause)
        return f"{n} steps"

    @server.tool(description="Exits the server process in the middle of the call.")
    def crash() -> str:
        os._exit(3)

    @server.tool(description="Always fails.")
    def fail() -> str:
        raise ValueError("this tool always fails")

    @server.tool(description="A text of n characters.")
    def big(n: int) -> str:
        return "x" * n

    @server.tool(
        description="Waits (at most 5 s) until a second call meets it.", annotations=READ_ONLY
    )
    async def meet(name: str) -> str:
        arrived = asyncio.Event()
        arrivals.append(arrived)
        if len(arrivals) % 2 == 0:
            for event in arrivals:
                event.set()
        try:
            await asyncio.wait_for(arrived.wait(), 5)
        except TimeoutError:
            return f"{name} waited alone"
        return f"{name} met"

    @server.tool(description="Adds the tool `grown` and says the list changed.")
    async def grow(ctx: Context) -> str:
        def grown() -> str:
            return "grown here"

        server.add_tool(grown, description="A tool that came later.")
        if ctx.request_context.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await ctx.notify_tools_changed()  # to `subscriptions/listen`
        else:
            await ctx.session.send_tool_list_changed()  # notifications/tools/list_changed
        return "grew"

    return server


def require_token(app: Any, token: str) -> Any:
    """An ASGI app that answers 401 unless the request carries the bearer token."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"no token"})
            return
        await app(scope, receive, send)

    return guarded


def main(argv: list[str]) -> None:
    """Serve the toolbox over stdio or Streamable HTTP."""
    transport, marks = argv[0], Path(argv[1])
    with (marks / "starts").open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    print(f"toolbox {os.getpid()} starting", file=sys.stderr, flush=True)
    if transport == "stdio":
        build(marks).run("stdio")
        return
    import uvicorn

    port = int(argv[2])
    app: Any
    if transport == "oauth":
        from tests.mcp_oauth import protected_app

        app = protected_app(partial(build, marks), port, marks)
    else:
        app = build(marks).streamable_http_app()
    if len(argv) > 3:
        app = require_token(app, argv[3])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
