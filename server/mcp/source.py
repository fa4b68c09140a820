"""One MCP server as a tool source: its connection, its tools in the registry, its calls.

A supervisor task holds the connection (`mcp.Client`, entered and left in that one
task, as anyio wants). Connected, it lists the tools and registers each one (opt-in,
`naming`), then follows changes: `subscriptions/listen` where the server speaks the
2026-07-28 revision, else `notifications/tools/list_changed` and a re-read every
`refreshSeconds`. When the connection fails (the process died, the stream broke, a
call found it closed, a health check went unanswered) the supervisor reconnects after a
backoff (0.2 s doubling to 30 s, back to 0.2 s once a connection lasted a minute);
leaving a stdio connection ends its process (stdin closed, then terminated). The
tools stay registered meanwhile, and a call waits up to `connectTimeoutSeconds` for
the connection, else fails with the last error.

A hung server is found by health checks: a `tools/list` round trip (every revision
has it; `ping` is gone from 2026-07-28) every `healthCheckSeconds`, and at once when a
call outlives its `timeoutSeconds` (that call fails alone). A check unanswered within
`healthTimeoutSeconds` drops the connection; calls made while that check is out wait
for its answer, then for the restart. A connection attempt is bounded too
(`HANDSHAKE_SECONDS`). A stdio server's stderr goes to the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, Literal

import httpx2
from mcp import Client
from mcp.client._transport import TransportStreams
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, ToolListChangedNotification
from mcp_types import Tool as McpTool

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from server.kernel.abort import NEVER, AbortSignal
from server.kernel.tools import Tool, ToolExecution, ToolProgress, ToolRegistry, ToolReturn
from server.mcp import naming
from server.mcp.oauth import MemoryTokens, client_credentials
from server.mcp.results import failed, tool_return
from server.mcp.stderr import StderrLog
from server.settings.mcp_servers import McpServerConfig

log = logging.getLogger(__name__)

FIRST_BACKOFF = 0.2
MAX_BACKOFF = 30.0
STABLE_SECONDS = 60.0
"""A connection that lasted this long resets the backoff."""
HANDSHAKE_SECONDS = 60.0
"""How long a connection attempt may take, process start included (generous: a stdio
server's start is slow on a loaded machine); then it is given up and tried again."""

Health = Literal["connecting", "ready", "down", "closed"]
STATES = {
    "connecting": reg.PLUGIN_STATE_CONNECTING,
    "ready": reg.PLUGIN_STATE_READY,
    "down": reg.PLUGIN_STATE_UNAVAILABLE,
    "closed": reg.PLUGIN_STATE_UNAVAILABLE,
}


class ConnectionLost(Exception):
    """The server closed the connection, or a call found it closed."""


class Unresponsive(Exception):
    """The server did not answer a health check in time."""


class McpSource:
    """One configured MCP server, kept connected; its tools registered while it is known."""

    def __init__(self, config: McpServerConfig, registry: ToolRegistry) -> None:
        self.config = config
        self._registry = registry
        self.health: Health = "connecting"
        self.last_error = ""
        self._client: Client | None = None
        self._connected = asyncio.Event()
        self._broken = asyncio.Event()
        self._registered: dict[str, tuple[McpTool, Callable[[], None]]] = {}
        """By MCP tool name: its definition and the disposer of its registered tool."""
        self._task: asyncio.Task[None] | None = None
        self._http_status = 0
        """The last HTTP error status of the current connection attempt."""
        self.restarts = 0
        """Connection attempts after the first."""
        self._tools_changed = asyncio.Event()
        """Set by `notifications/tools/list_changed` (servers before 2026-07-28)."""
        self._check_now = asyncio.Event()
        """Set when a call timed out: check the server's health at once."""
        self._probe: asyncio.Future[None] | None = None
        """The health check out after a call timed out; later calls wait for it."""
        self._tokens = MemoryTokens()
        """The OAuth token, kept across reconnections."""

    @property
    def name(self) -> str:
        """The server's configured name."""
        return self.config.name

    def tools(self) -> list[str]:
        """The names (as the model sees them) of the tools registered now."""
        return sorted(naming.model_name(self.name, t) for t in self._registered)

    def describe(self) -> reg.ToolSource:
        """This server as `ListToolSources` shows it."""
        config = self.config
        return reg.ToolSource(
            name=self.name,
            transport="stdio" if config.command else "streamable-http",
            endpoint=config.command or config.url,
            state=STATES[self.health],
            last_error=self.last_error,
            tools=self.tools(),
            restarts=self.restarts,
            protocol=self._client.protocol_version or "" if self._client is not None else "",
        )

    def start(self) -> None:
        """Start the supervisor (it connects, and reconnects, by itself)."""
        self._task = asyncio.get_running_loop().create_task(self._supervise())

    async def wait_connected(self, seconds: float) -> bool:
        """Wait (at most `seconds`) for a connection; whether there is one."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._connected.wait()
        return self._connected.is_set()

    async def close(self) -> None:
        """Stop the supervisor, close the connection and unregister the tools."""
        self.health = "closed"
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for _, dispose in self._registered.values():
            dispose()
        self._registered.clear()

    # -- the connection ---------------------------------------------------------------------

    def _client_of(self, stderr: StderrLog | None) -> Client:
        config = self.config
        options: dict[str, Any] = {
            "message_handler": self._on_message,
            "mode": config.protocol,  # "auto" or "legacy"
        }
        if config.command:
            assert stderr is not None
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(config.env) or None,
                cwd=config.cwd or None,
            )
            return Client(stdio_client(params, errlog=stderr.writer), **options)
        headers = dict(config.headers)
        if config.token_env:
            headers["Authorization"] = f"Bearer {os.environ.get(config.token_env, '')}"
        auth = client_credentials(config.url, config.oauth, self._tokens) if config.oauth else None
        return Client(http_transport(config.url, headers, self._http_failed, auth), **options)

    async def _on_message(self, message: object) -> None:
        """What the SDK passes on: a tools list-changed notification starts a re-read."""
        if isinstance(message, ToolListChangedNotification):
            self._tools_changed.set()

    async def _supervise(self) -> None:
        backoff = FIRST_BACKOFF
        attempts = 0
        while True:
            began = time.monotonic()
            if attempts:
                self.restarts += 1
            attempts += 1
            stderr = StderrLog(self.name) if self.config.command else None
            try:
                await self._connect_once(stderr)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # an exception group from anyio too
                status = f" (HTTP {self._http_status})" if self._http_status else ""
                self.last_error = describe(error) + status
                self._http_status = 0
            finally:
                if stderr is not None:
                    stderr.close()
            self._client = None
            self._connected.clear()
            self.health = "down"
            if time.monotonic() - began >= STABLE_SECONDS:
                backoff = FIRST_BACKOFF
            log.warning(
                "MCP server %s: disconnected (%s); reconnecting in %.1f s",
                self.name, self.last_error or "closed", backoff,
            )  # fmt: skip
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _connect_once(self, stderr: StderrLog | None) -> None:
        self.health = "connecting"
        async with contextlib.AsyncExitStack() as stack:
            try:
                async with asyncio.timeout(HANDSHAKE_SECONDS):
                    client = await stack.enter_async_context(self._client_of(stderr))
                    self._tools_changed.clear()
                    await self._sync_tools(client)
            except TimeoutError:
                raise Unresponsive(
                    f"no answer to the handshake and tools/list within {HANDSHAKE_SECONDS:g} s"
                ) from None
            self._broken.clear()
            self._check_now.clear()
            self._client = client
            self.health = "ready"
            self.last_error = ""
            self._connected.set()
            log.info("MCP server %s: connected, %d tool(s)", self.name, len(self._registered))
            watch = asyncio.ensure_future(self._follow_changes(client))
            checks = asyncio.ensure_future(self._check_health(client))
            broken = asyncio.ensure_future(self._broken.wait())
            tasks = {watch, checks, broken}
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._leave(client)  # leaving takes a while (a process to end): no new calls
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self._end_probe()
            for task in (checks, watch):
                if task in done and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            raise ConnectionLost("the connection closed")

    async def _check_health(self, client: Client) -> None:
        """Check every `healthCheckSeconds`, or at once when asked; raise when unanswered."""
        config = self.config
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(config.health_check_seconds):
                    await self._check_now.wait()
            self._check_now.clear()
            try:
                async with asyncio.timeout(config.health_timeout_seconds):
                    await client.list_tools(cache_mode="refresh")
            except TimeoutError:
                self._leave(client)
                raise Unresponsive(
                    f"no answer to a health check within {config.health_timeout_seconds:g} s"
                ) from None
            except MCPError as error:
                if error.code == CONNECTION_CLOSED:
                    raise
                # Any other answer is an answer: the server is alive.
            finally:
                self._end_probe()

    async def _follow_changes(self, client: Client) -> None:
        """Re-list the tools whenever the server says they changed (or on a schedule)."""
        try:
            async with client.listen(tools_list_changed=True) as changes:
                async for _ in changes:
                    await self._sync_tools(client)
            return  # the server ended the stream: reconnect
        except ListenNotSupportedError:
            pass
        while True:  # an older server: its notifications, and a re-read now and then
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.refresh_seconds):
                    await self._tools_changed.wait()
            self._tools_changed.clear()
            await self._sync_tools(client)

    async def _sync_tools(self, client: Client) -> None:
        listed: dict[str, McpTool] = {}
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            listed.update((tool.name, tool) for tool in page.tools)
            if not (cursor := page.next_cursor):
                break
        for name in list(self._registered):
            old, dispose = self._registered[name]
            if listed.get(name) != old:
                dispose()
                del self._registered[name]
        for name, tool in listed.items():
            if name not in self._registered:
                self._register(tool)

    def _register(self, tool: McpTool) -> None:
        safe = bool(
            self.config.trust_annotations and tool.annotations and tool.annotations.read_only_hint
        )
        registered = Tool(
            name=naming.model_name(self.name, tool.name),
            description=tool.description or tool.title or tool.name,
            input_schema=tool.input_schema,
            execute=partial(self.call, tool.name),
            parallel_safe=safe,
            enabled_by=partial(naming.enables, self.name, tool.name),
        )
        try:
            dispose = self._registry.register(registered)
        except (ValueError, TypeError) as error:
            log.warning("MCP server %s: tool %s not offered: %s", self.name, tool.name, error)
            return
        self._registered[tool.name] = (tool, dispose)

    # -- calls ---------------------------------------------------------------------------

    async def call(self, tool: str, exec: ToolExecution) -> ToolReturn:
        """Call `tool` with the call's arguments; every failure is this call's error."""
        where = f'MCP server "{self.name}"'
        arguments = exec.arguments
        if not isinstance(arguments, dict):
            return failed(f'{where}: the arguments of "{tool}" must be a JSON object')
        signal = exec.signal or NEVER
        if self._probe is not None:  # a check is out after a timeout: is the server alive?
            await signal.race(asyncio.shield(self._probe))
        if self._client is None:
            connected = await signal.race(self.wait_connected(self.config.connect_timeout_seconds))
            if not connected:
                why = f": {self.last_error}" if self.last_error else ""
                return failed(f"{where} is not connected{why}; it is being restarted")
        client = self._client
        assert client is not None
        timeout = self.config.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                result = await self._call(client, tool, arguments, exec.report_progress, signal)
        except TimeoutError:
            self._check_alive()
            return failed(f'{where}: "{tool}" timed out after {timeout:g} s and was cancelled')
        except MCPError as error:
            if error.code != CONNECTION_CLOSED:
                return failed(f'{where}: "{tool}" failed: {error}')
            self._lost(client)
            return failed(f'{where} closed the connection during "{tool}"; it is being restarted')
        except (ConnectionError, OSError) as error:
            self._lost(client)
            return failed(f'{where}: "{tool}" failed: {describe(error)}; it is being restarted')
        return tool_return(result, self.name, tool, self.config.max_result_chars)

    async def _call(
        self,
        client: Client,
        tool: str,
        arguments: dict[str, Any],
        report: Callable[[ToolProgress], None],
        signal: AbortSignal,
    ) -> Any:
        """One `tools/call`, its `notifications/progress` passed on to `report`."""

        async def progressed(progress: float, total: float | None, message: str | None) -> None:
            report(ToolProgress(progress=progress, total=total, message=message or ""))

        return await signal.race(client.call_tool(tool, arguments, progress_callback=progressed))

    def _check_alive(self) -> None:
        """Check the server now (a call timed out); calls made until the answer wait for it."""
        if self._probe is None and self._client is not None:
            self._probe = asyncio.get_running_loop().create_future()
            self._check_now.set()

    def _end_probe(self) -> None:
        """The check after a timeout is answered (or the connection is gone): calls go on."""
        if self._probe is not None and not self._probe.done():
            self._probe.set_result(None)
        self._probe = None

    def _http_failed(self, status: int) -> None:
        self._http_status = status

    def _lost(self, client: Client) -> None:
        """A call found `client` closed: later calls wait for the reconnection."""
        self._leave(client)
        self._broken.set()

    def _leave(self, client: Client) -> None:
        """`client` takes no more calls: later ones wait for the reconnection."""
        if self._client is client:
            self._client = None
            self._connected.clear()
            if self.health != "closed":
                self.health = "down"


@contextlib.asynccontextmanager
async def http_transport(
    url: str,
    headers: dict[str, str],
    on_failure: Callable[[int], None],
    auth: httpx2.Auth | None = None,
) -> AsyncIterator[TransportStreams]:
    """Streamable HTTP with our headers, on an HTTP client closed with the connection.

    `on_failure` hears each HTTP error status (the SDK's errors do not name it);
    `auth` (OAuth) adds and renews the bearer token.
    """

    async def seen(response: Any) -> None:
        if response.status_code >= 400:
            on_failure(response.status_code)

    async with create_mcp_http_client(headers=headers, auth=auth) as http:
        http.event_hooks["response"].append(seen)
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def describe(error: BaseException) -> str:
    """An error in one line; an exception group by its first leaf."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error) or type(error).__name__
    return text.splitlines()[0][:300]
