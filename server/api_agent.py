"""The `AgentService` servicer: messages in, session events out."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_service_pb2 as pb
from agentloop.v1 import agent_service_pb2_grpc as rpc
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from server import validation
from server.agent import Agent
from server.api_factory import page_bounds
from server.errors import AgentLoopError, InvalidArgument
from server.factory import AgentFactory, check_id
from server.session import SessionLog, session_message
from server.status import code_of, mapped

Context = grpc.aio.ServicerContext[Any, Any]

STREAM_BATCH = 500
"""The most session events one stream response carries."""

LIVE_EVENT_BUFFER = 1024
"""Live agent events held for a slow stream reader; older ones are dropped first."""


def message_content(text: str, content: list[c.ContentBlock], field: str) -> list[c.ContentBlock]:
    """The content of a request: `text` as a block, then `content`; never empty."""
    for i, block in enumerate(content):
        if block.WhichOneof("block") is None:
            raise InvalidArgument(f"content[{i}]", "is an empty content block")
    blocks = [c.ContentBlock(text=c.TextBlock(text=text))] if text else []
    blocks.extend(content)
    if not blocks:
        raise InvalidArgument(field, "needs text or content")
    return blocks


class AgentServicer(rpc.AgentServiceServicer):
    """Talks to live agents and reads their sessions."""

    def __init__(self, factory: AgentFactory) -> None:
        self.factory = factory

    @mapped
    async def SendMessage(
        self, request: pb.SendMessageRequest, context: Context
    ) -> pb.SendMessageResponse:
        """Queue a prompt."""
        agent = self.factory.get(request.agent_id)
        validation.check_message(self.factory.runtime.limits, request.text, request.content)
        content = message_content(request.text, list(request.content), "text")
        agent.send(content, request.source)
        return pb.SendMessageResponse(next_seq=len(agent.session), status=agent.status)

    @mapped
    async def SteerMessage(
        self, request: pb.SteerMessageRequest, context: Context
    ) -> pb.SteerMessageResponse:
        """Steer the running turn, or queue when idle."""
        agent = self.factory.get(request.agent_id)
        validation.check_message(self.factory.runtime.limits, request.text, request.content)
        content = message_content(request.text, list(request.content), "text")
        steering = agent.steer(content, request.source)
        return pb.SteerMessageResponse(next_seq=len(agent.session), steering=steering)

    @mapped
    async def InjectContext(
        self, request: pb.InjectContextRequest, context: Context
    ) -> pb.InjectContextResponse:
        """Add context to the conversation."""
        agent = self.factory.get(request.agent_id)
        validation.check_message(self.factory.runtime.limits, request.text, request.content)
        content = message_content(request.text, list(request.content), "text")
        hook_context = d.HookContext(
            content=content, source=request.source, envelope=request.envelope
        )
        if request.HasField("meta"):
            validation.check_finite(request.meta, "meta")
            hook_context.meta.CopyFrom(request.meta)
        agent.inject(hook_context)
        return pb.InjectContextResponse(next_seq=len(agent.session))

    @mapped
    async def CancelTurn(
        self, request: pb.CancelTurnRequest, context: Context
    ) -> pb.CancelTurnResponse:
        """Cancel the running turn."""
        agent = self.factory.get(request.agent_id)
        return pb.CancelTurnResponse(cancelled=agent.cancel(request.reason))

    @mapped
    async def WaitIdle(self, request: pb.WaitIdleRequest, context: Context) -> pb.WaitIdleResponse:
        """Wait for the agent to become idle."""
        agent = self.factory.get(request.agent_id)
        timeout = (
            validation.duration_seconds(request.timeout, "timeout", 3600)
            if request.HasField("timeout")
            else 30
        )
        idle = agent.is_idle()  # first: a zero timeout is a poll (wait_for(…, 0) never runs it)
        if not idle:
            try:
                await asyncio.wait_for(agent.when_idle(), timeout)
                idle = True
            except TimeoutError:
                idle = False
        return pb.WaitIdleResponse(idle=idle, status=agent.status, next_seq=len(agent.session))

    @mapped
    async def GetSession(
        self, request: pb.GetSessionRequest, context: Context
    ) -> pb.GetSessionResponse:
        """Describe a session."""
        session = await self._session(request.agent_id, request.session_id)
        return pb.GetSessionResponse(session=session_message(session))

    @mapped
    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: Context
    ) -> pb.ListSessionsResponse:
        """List every session, a page at a time."""
        offset, size = page_bounds(request.page_size, request.page_token, 100, 1000)
        ids = await self.factory.session_ids()
        page = [await self.factory.describe(i) for i in ids[offset : offset + size]]
        next_token = str(offset + size) if offset + size < len(ids) else ""
        return pb.ListSessionsResponse(sessions=page, next_page_token=next_token)

    @mapped
    async def ForkSession(
        self, request: pb.ForkSessionRequest, context: Context
    ) -> pb.ForkSessionResponse:
        """Fork a session at a turn boundary."""
        check_id("session_id", request.session_id)
        boundary = request.boundary_seq if request.HasField("boundary_seq") else None
        session = await self.factory.fork(request.session_id, boundary, request.new_session_id)
        return pb.ForkSessionResponse(session=session)

    @mapped
    async def ListSessionEvents(
        self, request: pb.ListSessionEventsRequest, context: Context
    ) -> pb.ListSessionEventsResponse:
        """Page through a session log."""
        session = await self._session(request.agent_id, request.session_id)
        start, size = page_bounds(request.page_size, request.page_token, 500, 5000)
        if not request.page_token:
            start = request.from_seq
        events = session.events[start : start + size]
        end = start + len(events)
        return pb.ListSessionEventsResponse(
            events=events, next_page_token=str(end) if end < len(session) else ""
        )

    async def StreamSessionEvents(
        self, request: pb.StreamSessionEventsRequest, context: Context
    ) -> AsyncIterator[pb.StreamSessionEventsResponse]:
        """Replay the log from `from_seq`, then follow it live, with the agent's events."""
        try:
            session = await self._session(request.agent_id, request.session_id)
            agent = self.factory.agents.get(session.agent_id) if request.agent_id else None
        except AgentLoopError as error:
            await context.abort(code_of(error), str(error))
            return
        live: deque[ae.AgentEvent] = deque(maxlen=LIVE_EVENT_BUFFER)

        def on_live(event: ae.AgentEvent) -> None:
            copy = ae.AgentEvent()
            copy.CopyFrom(event)
            live.append(copy)
            session.wake_waiters()

        unsubscribe = agent.subscribe(on_live) if agent is not None else None
        cursor = request.from_seq
        try:
            while True:
                if cursor < len(session) or live:
                    # Everything appended since the last batch goes in one response:
                    # a turn's burst of chunks costs one message, not one each.
                    events = session.events[cursor : cursor + STREAM_BATCH]
                    cursor += len(events)
                    agent_events = list(live)
                    live.clear()
                    yield pb.StreamSessionEventsResponse(events=events, agent_events=agent_events)
                    continue
                if request.replay_only or not self._follows(session, agent):
                    return
                await session.wait_beyond(cursor)
        finally:
            if unsubscribe is not None:
                unsubscribe()

    def _follows(self, session: SessionLog, agent: Agent | None) -> bool:
        """Whether more events may come: a live agent still drives the session."""
        if agent is not None:
            return not (agent.disposed and self.factory.sessions.get(session.session_id) is None)
        return self.factory.sessions.get(session.session_id) is session

    async def _session(self, agent_id: str, session_id: str) -> SessionLog:
        if agent_id and session_id:
            raise InvalidArgument("session_id", "set agent_id or session_id, not both")
        if agent_id:
            return self.factory.get(agent_id).session
        if not session_id:
            raise InvalidArgument("agent_id", "set agent_id or session_id")
        return await self.factory.session(session_id)
