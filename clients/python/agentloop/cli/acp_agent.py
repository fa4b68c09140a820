"""`agentloop acp`: an Agent Client Protocol agent on stdio, backed by an agentloop server.

An editor (Zed, a JetBrains IDE, a Neovim plugin) starts `agentloop acp` and speaks
ACP on its stdin and stdout; each ACP call becomes agentloop calls:

| ACP | agentloop |
| --- | --- |
| `session/new` | `CreateAgent`: ACP session id = session id = agent id; cwd in metadata |
| `session/load` | `ResumeAgent` (unless live), then the stored log replayed as updates |
| `session/prompt` | `SendMessage`, the turn streamed back as `session/update` |
| `session/cancel` | `CancelTurn` |
| `session/request_permission` | an approval of the turn: allow once, or reject |

When the server went away, each request first waits (at most `RECONNECT_SECONDS`) for
the channel to reach it again; a prompt to an agent the server no longer holds (it
restarted) resumes it first. gRPC errors become JSON-RPC errors carrying the status and
the server's details.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any, cast

import grpc
from acp import PROTOCOL_VERSION, RequestError, run_agent, text_block, tool_content
from acp import Agent as AcpAgent
from acp import Client as AcpClient
from acp.schema import (
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptResponse,
    ToolCallUpdate,
)
from acp.stdio import stdio_streams

from agentloop.cli.acp_input import checked
from agentloop.cli.acp_updates import STOP_REASONS, LiveUpdates, Update, arguments, prompt_text
from agentloop.cli.acp_updates import replayed as replayed_updates
from agentloop.cli.version import version
from agentloop.client import Client
from agentloop.stream import SessionStream
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, approval_pb2
from agentloop.v1 import session_event_pb2 as ev

ALLOW = "allow_once"
REJECT = "reject_once"
PERMISSION_OPTIONS = [
    PermissionOption(option_id=ALLOW, name="Allow once", kind="allow_once"),
    PermissionOption(option_id=REJECT, name="Reject", kind="reject_once"),
]
REJECTED_REASON = "rejected in the editor"
CANCEL_REASON = "cancelled in the editor"
VIA = "acp"
"""Where the answers come from (`ResolveApprovalRequest.via`): recorded as `api:acp`."""
MAX_LINE_BYTES = 50 * 1024 * 1024
"""The longest line read from the editor (the SDK's own default)."""
RECONNECT_SECONDS = 10.0
"""How long a request waits for a server that went away to be reachable again."""


async def reachable(channel: grpc.aio.Channel, seconds: float = RECONNECT_SECONDS) -> None:
    """Wait (bounded) until `channel` is connected, asking it to try now.

    Past the bound the request goes ahead and fails `UNAVAILABLE`, named.
    """
    state = channel.get_state(try_to_connect=True)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while state != grpc.ChannelConnectivity.READY:
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)


@contextlib.contextmanager
def as_json_rpc_errors() -> Iterator[None]:
    """A failed gRPC call as a JSON-RPC error naming its status and the server's details."""
    try:
        yield
    except grpc.aio.AioRpcError as error:
        data = {"status": error.code().name, "details": error.details() or ""}
        if error.code() == grpc.StatusCode.NOT_FOUND:
            raise RequestError(-32002, "Resource not found", data) from None
        if error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
            raise RequestError.invalid_params(data) from None
        raise RequestError.internal_error(data) from None


class AcpBridge:
    """The ACP agent: one per editor connection, any number of sessions."""

    def __init__(self, client: Client, options: agent_pb2.AgentOptions | None = None) -> None:
        self._client = client
        self._options = options
        self._conn: AcpClient | None = None
        self._live: set[str] = set()
        """Sessions whose agent this bridge created or resumed on the current server."""

    def on_connect(self, conn: AcpClient) -> None:
        """The editor's side of the connection: updates and permission requests go there."""
        self._conn = conn

    @property
    def conn(self) -> AcpClient:
        """The editor's side (set before any request arrives)."""
        assert self._conn is not None, "on_connect comes first"
        return self._conn

    async def initialize(
        self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
        **_: Any,
    ) -> InitializeResponse:  # fmt: skip
        """Version 1; sessions load; prompts are text with embedded context."""
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True, prompt_capabilities=PromptCapabilities(embedded_context=True)
            ),
            agent_info=Implementation(name="agentloop", title="agentloop", version=version()),
        )

    async def new_session(self, cwd: str, **_: Any) -> NewSessionResponse:
        """A new agent on a new session; the editor's MCP servers are not used."""
        session_id = str(uuid.uuid4())
        await reachable(self._client.channel)
        with as_json_rpc_errors():
            await self._client.create(session_id, self._options, session_id=session_id, cwd=cwd)
        self._live.add(session_id)
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, **_: Any) -> LoadSessionResponse:
        """Resume the session's agent (unless it is live) and replay its history."""
        await reachable(self._client.channel)
        with as_json_rpc_errors():
            await self._ensure_agent(session_id)
            stream = self._client.stream(session_id=session_id, replay_only=True)
            try:
                async for event in stream:
                    await self._send(session_id, replayed_updates(event))
            finally:
                stream.close()
        return LoadSessionResponse()

    async def prompt(self, session_id: str, prompt: list[Any], **_: Any) -> PromptResponse:
        """Send the prompt and stream the turn that answers it, to its end."""
        text = prompt_text(prompt)
        if not text.strip():
            raise RequestError.invalid_params({"prompt": "no text in the prompt"})
        await reachable(self._client.channel)
        # The turn is read from this stream, whose live agent events carry tool progress.
        stream = SessionStream(lambda: self._client.agents, agent_id=session_id)
        try:
            with as_json_rpc_errors():
                if session_id not in self._live:
                    await self._ensure_agent(session_id)
                try:
                    turn = await self._client.send(session_id, text, stream=stream)
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    self._live.discard(session_id)  # the server restarted: resume, then send
                    await self._ensure_agent(session_id)
                    turn = await self._client.send(session_id, text, stream=stream)
                return await self._follow(session_id, turn, stream)
        finally:
            stream.close()

    async def cancel(self, session_id: str, **_: Any) -> None:
        """Cancel the running turn (the prompt then answers `cancelled`)."""
        with contextlib.suppress(grpc.aio.AioRpcError):  # a notification has no answer
            await self._client.cancel(session_id, CANCEL_REASON)

    async def _ensure_agent(self, session_id: str) -> None:
        """The session's agent is live on the server: resumed unless it already is."""
        try:
            await self._client.factory.GetAgent(
                fac.GetAgentRequest(agent_id=session_id), timeout=self._client.timeout
            )
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
            await self._client.resume(session_id, session_id, self._options)
        self._live.add(session_id)

    async def _follow(self, session_id: str, turn: Any, stream: SessionStream) -> PromptResponse:
        live = LiveUpdates()
        asks: dict[str, asyncio.Task[None]] = {}
        # One writer sends the updates in the order they are made: the turn's events,
        # and the progress heard while a call runs (when no event comes).
        updates: asyncio.Queue[list[Update] | None] = asyncio.Queue()
        writer = asyncio.create_task(self._write(session_id, updates))
        stream.on_agent_events = lambda events: updates.put_nowait(live.heard(events))
        try:
            async for event in turn:
                kind = event.WhichOneof("payload")
                if kind == "approval_requested":
                    request = event.approval_requested
                    asks[request.approval_id] = asyncio.create_task(self._ask(session_id, request))
                elif kind == "approval_resolved":
                    ask = asks.pop(event.approval_resolved.approval_id, None)
                    if ask is not None and not ask.done():
                        ask.cancel()  # answered elsewhere (another client, the timeout)
                updates.put_nowait(live.of(event))
                if writer.done():
                    break  # the editor's side failed: its error is raised below
        finally:
            stream.on_agent_events = None
            for ask in asks.values():
                ask.cancel()
            updates.put_nowait(None)
            await writer
        if turn.dropped is not None or turn.end is None:
            return PromptResponse(stop_reason="cancelled")
        return PromptResponse(stop_reason=stop_reason(turn.end))

    async def _ask(self, session_id: str, request: approval_pb2.ApprovalRequested) -> None:
        """Ask the editor about one waiting call and pass its answer on."""
        why = f"{request.reason} (asked by {request.requested_by})" if request.reason else ""
        call = ToolCallUpdate(
            tool_call_id=request.call_id,
            title=request.tool_name,
            kind="other",
            status="pending",
            raw_input=arguments(request.arguments),
            content=[tool_content(text_block(why))] if why else None,
        )
        answer = await self.conn.request_permission(
            session_id=session_id, tool_call=call, options=PERMISSION_OPTIONS
        )
        outcome = answer.outcome
        if outcome.outcome != "selected":
            return  # the editor cancelled the prompt: its session/cancel ends the approval
        allow = outcome.option_id == ALLOW
        with contextlib.suppress(grpc.aio.AioRpcError):  # answered first elsewhere
            await self._client.resolve_approval(
                session_id,
                request.approval_id,
                allow=allow,
                reason="" if allow else REJECTED_REASON,
                via=VIA,
            )

    async def _write(self, session_id: str, queue: asyncio.Queue[list[Update] | None]) -> None:
        while (updates := await queue.get()) is not None:
            await self._send(session_id, updates)

    async def _send(self, session_id: str, updates: list[Update]) -> None:
        for update in updates:
            await self.conn.session_update(session_id=session_id, update=update)


def stop_reason(end: ev.SessionEvent) -> Any:
    """The ACP stop reason of a `turn_end`; a failed turn is a JSON-RPC error."""
    reason = end.turn_end.reason
    kind = reason.WhichOneof("kind") or ""
    if kind == "error":
        raise RequestError.internal_error(
            {"turn": end.turn_end.turn, "error": reason.error.message, "code": reason.error.code}
        )
    return STOP_REASONS.get(kind, "end_turn")


async def serve(client: Client, options: agent_pb2.AgentOptions | None) -> None:
    """Serve ACP on stdin/stdout until the editor closes stdin."""
    stdin, stdout = await stdio_streams(limit=MAX_LINE_BYTES)
    # The SDK routes only the methods an agent has (the rest: "Method not found").
    agent = cast("AcpAgent", AcpBridge(client, options))
    await run_agent(agent, stdout, checked(stdin, stdout))
