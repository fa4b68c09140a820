"""An MCP server for the tests, written with the `mcp` package's own server side.

    python -m tests.mcp_toolbox stdio DIR
    python -m tests.mcp_toolbox http DIR PORT [TOKEN]

DIR receives marker files the tests wait on (`slow.started`, `slow.cancelled`,
`starts`: one line per process start). Over HTTP, a TOKEN makes every request need
`Authorization: Bearer TOKEN` (401 otherwise).
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp_types import ToolAnnotations

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
"""A 1x1 PNG."""

READ_ONLY = ToolAnnotations(read_only_hint=True)


def build(marks: Path) -> MCPServer:
    """The toolbox: echo, add, picture, slow, crash, fail, big, meet and grow."""
    server: MCPServer = MCPServer("toolbox")
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
        await ctx.notify_tools_changed()
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
    server = build(marks)
    if transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    port = int(argv[2])
    app: Any = server.streamable_http_app()
    if len(argv) > 3:
        app = require_token(app, argv[3])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
