"""The `AgentService` servicer: messages in, session events out."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_service_pb2 as pb
from agentloop.v1 import agent_service_pb2_grpc as rpc
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from server.edge import page_tokens
from server.edge.api_approvals import ApprovalMethods
from server.edge.api_delete import DeleteMethods
from server.edge.api_stream_wire import response_bytes
from server.edge.session_filters import session_filter
from server.edge.status import abort, mapped
from server.kernel.errors import AgentLoopError, InvalidArgument, OutOfRange, Unavailable
from server.kernel.ids import check_id
from server.kernel.limits import check_pending
from server.lifecycle.factory import AgentFactory
from server.loop import validation
from server.loop.agent import Agent
from server.loop.compaction_triggers import compact_idle
from server.loop.context import usage_message
from server.sessions.listing import SessionFilter, list_sessions
from server.sessions.session import SessionLog, session_message
from server.stores import FIRST_SEQ, RequestRecord

Context = grpc.aio.ServicerContext[Any, Any]
Selecting = pb.GetSessionRequest | pb.ListSessionEventsRequest | pb.StreamSessionEventsRequest
Answer = TypeVar("Answer", bound=Message)

STREAM_BATCH = 500
"""The most session events one stream response carries."""

MAX_RESPONSE_BYTES = 3 * 1024 * 1024
"""The most event bytes one page or stream response carries (beyond its first event):
under the 4 MiB a client with gRPC's default limits accepts."""

COALESCE_PASSES = 2
"""Loop passes a woken stream lets run before it reads. A commit wakes the stream and
the writers that waited for it together; a driver settling its turn reports its new
status two passes later (the settle's shield, then its task). Letting them run first
puts a turn's end and its status in one response, not two: a response costs far more
server CPU (gRPC's write path) than two task switches."""

MAX_INSTRUCTIONS_BYTES = 16 * 1024
"""The longest focus instructions a CompactAgent call may carry."""

LIVE_EVENT_BUFFER = 1024
"""Live agent events held for a slow stream reader; older ones are dropped first."""


def _passes(count: int) -> asyncio.Future[None]:
    """A future whose awaiting task resumes `count` loop passes from now.

    As `count` × `sleep(0)`, but the task wakes once: a stream's task resumes its whole
    chain of awaits (gRPC's call, the interceptor, this generator) at every wake-up.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    _count_down(loop, done, count - 1)
    return done


def _count_down(loop: asyncio.AbstractEventLoop, done: asyncio.Future[None], left: int) -> None:
    # A module function, not a closure calling itself: that would be a reference cycle
    # (function → cell → function) left to the garbage collector at every wake-up.
    if left > 0:
        loop.call_soon(_count_down, loop, done, left - 1)
    elif not done.done():
        done.set_result(None)  # the awaiting task resumes in the next pass


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


class AgentServicer(ApprovalMethods, DeleteMethods, rpc.AgentServiceServicer):
    """Talks to live agents and reads their sessions."""

    def __init__(self, factory: AgentFactory, prices: tuple[pb.Price, ...] = ()) -> None:
        self.factory = factory
        self.runtime = factory.runtime
        self.prices = prices
        """The config's price table, which GetSession hands out for pricing usage."""

    @mapped
    async def SendMessage(
        self, request: pb.SendMessageRequest, context: Context
    ) -> pb.SendMessageResponse:
        """Queue a prompt; answer once it is durable."""
        agent = self.factory.get(request.agent_id)
        validation.check_message(self.factory.runtime.limits, request.text, request.content)
        content = message_content(request.text, list(request.content), "text")

        def accept() -> pb.SendMessageResponse:
            agent.send(content, request.source, request.request_id)
            # The message is queued, so the agent has work: it is running, or its driver
            # is about to open the turn that answers it. Reporting the driver's status of
            # this instant would say IDLE for the message that wakes it.
            status = ae.AGENT_STATUS_RUNNING if not agent.is_idle() else agent.status
            return pb.SendMessageResponse(next_seq=agent.session.durable, status=status)

        return await self._once(
            agent, "SendMessage", request.request_id, pb.SendMessageResponse, accept
        )

    @mapped
    async def SteerMessage(
        self, request: pb.SteerMessageRequest, context: Context
    ) -> pb.SteerMessageResponse:
        """Steer the running turn, or queue when idle; answer once it is durable."""
        agent = self.factory.get(request.agent_id)
        validation.check_message(self.factory.runtime.limits, request.text, request.content)
        content = message_content(request.text, list(request.content), "text")

        def accept() -> pb.SteerMessageResponse:
            steering = agent.steer(content, request.source, request.request_id)
            return pb.SteerMessageResponse(next_seq=agent.session.durable, steering=steering)

        return await self._once(
            agent, "SteerMessage", request.request_id, pb.SteerMessageResponse, accept
        )

    @mapped
    async def InjectContext(
        self, request: pb.InjectContextRequest, context: Context
    ) -> pb.InjectContextResponse:
        """Add context to the conversation; answer once it is durable."""
        agent = self.factory.get(request.agent_id)
        validation.check_message(self.factory.runtime.limits, request.text, request.content)
        content = message_content(request.text, list(request.content), "text")
        hook_context = d.HookContext(
            content=content, source=request.source, envelope=request.envelope
        )
        if request.HasField("meta"):
            validation.check_finite(request.meta, "meta")
            hook_context.meta.CopyFrom(request.meta)

        def accept() -> pb.InjectContextResponse:
            agent.inject(hook_context, request.request_id)
            return pb.InjectContextResponse(next_seq=agent.session.count)

        return await self._once(
            agent, "InjectContext", request.request_id, pb.InjectContextResponse, accept
        )

    async def _once(
        self,
        agent: Agent,
        method: str,
        request_id: str,
        kind: type[Answer],
        accept: Callable[[], Answer],
    ) -> Answer:
        """Run `accept` once per request id; answer when what it wrote is durable.

        The answer is recorded in the same tick as the message, hence the same commit:
        a retry finds it exactly when the message is stored. Either way the call's own
        task waits for that commit (`settle`), not a future shared with duplicates
        (which it would have to shield: two loop passes more).
        """
        if not request_id:
            check_pending(self.runtime.limits, agent.agent_id, len(agent.session.inbox))
            answer = accept()
            await agent.session.settle()
            return answer
        answers: list[Answer] = []

        def accepted() -> bytes:
            check_pending(self.runtime.limits, agent.agent_id, len(agent.session.inbox))
            answer = accept()
            raw = answer.SerializeToString()
            agent.session.record(RequestRecord(agent.agent_id, request_id, method, raw))
            answers.append(answer)
            return raw

        raw = await self.runtime.requests.accept_once(
            agent.agent_id, request_id, method, accepted, agent.session, agent
        )
        return answers[0] if answers else kind.FromString(raw)

    @mapped
    async def CompactAgent(
        self, request: pb.CompactAgentRequest, context: Context
    ) -> pb.CompactAgentResponse:
        """Summarise the idle agent's older history; answer once the summary is durable."""
        agent = self.factory.get(request.agent_id)
        if len(request.instructions.encode()) > MAX_INSTRUCTIONS_BYTES:
            raise InvalidArgument(
                "instructions", f"must be at most {MAX_INSTRUCTIONS_BYTES} bytes of UTF-8"
            )
        keep = request.keep_recent_tokens if request.HasField("keep_recent_tokens") else None
        if keep is not None and keep > validation.MAX_TOKEN_SETTING:
            raise InvalidArgument(
                "keep_recent_tokens", f"must be at most {validation.MAX_TOKEN_SETTING}"
            )

        async def run() -> bytes:
            outcome = await compact_idle(agent, request.instructions, keep, request.request_id)
            answer = pb.CompactAgentResponse(
                compacted=outcome.event is not None, reason=outcome.reason
            )
            if outcome.event is not None:
                answer.event_seq = outcome.event.seq
                answer.compaction.CopyFrom(outcome.event.context_message.compaction)
            answer.context_usage.CopyFrom(usage_message(agent.session, agent.context))
            raw = answer.SerializeToString()
            if request.request_id:
                record = RequestRecord(agent.agent_id, request.request_id, "CompactAgent", raw)
                agent.session.record(record)
            await agent.session.settle()
            return raw

        raw = await self.runtime.requests.once(
            agent.agent_id, request.request_id, "CompactAgent", run, agent
        )
        return pb.CompactAgentResponse.FromString(raw)

    @mapped
    async def CancelTurn(
        self, request: pb.CancelTurnRequest, context: Context
    ) -> pb.CancelTurnResponse:
        """Cancel the running turn; answer once the dropped messages are recorded."""
        agent = self.factory.get(request.agent_id)
        cancelled, dropped = self.factory.cancel(agent, request.reason)  # and its turn's children
        await agent.session.settle()
        return pb.CancelTurnResponse(cancelled=cancelled, dropped=dropped)

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
        return pb.WaitIdleResponse(idle=idle, status=agent.status, next_seq=agent.session.durable)

    @mapped
    async def GetSession(
        self, request: pb.GetSessionRequest, context: Context
    ) -> pb.GetSessionResponse:
        """Describe a session."""
        session = await self._session(request)
        return pb.GetSessionResponse(session=session_message(session), prices=self.prices)

    @mapped
    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: Context
    ) -> pb.ListSessionsResponse:
        """List the sessions the filters keep, a page at a time."""
        size = page_tokens.check_page_size(request.page_size, 100, 1000)
        keep = session_filter(request)
        params = "" if keep == SessionFilter() else keep.describes()
        after = page_tokens.last_key(request.page_token, "ListSessions", params)
        page = await list_sessions(self.factory.catalogue, keep, after, size)
        more = page.more and bool(page.last_examined)
        next_token = page_tokens.issue("ListSessions", page.last_examined, params) if more else ""
        return pb.ListSessionsResponse(sessions=page.sessions, next_page_token=next_token)

    @mapped
    async def ForkSession(
        self, request: pb.ForkSessionRequest, context: Context
    ) -> pb.ForkSessionResponse:
        """Fork a session at a turn boundary."""
        check_id("session_id", request.session_id)
        boundary = request.boundary_seq if request.HasField("boundary_seq") else None
        session = await self.factory.catalogue.fork(
            request.session_id, boundary, request.new_session_id
        )
        return pb.ForkSessionResponse(session=session)

    @mapped
    async def ListSessionEvents(
        self, request: pb.ListSessionEventsRequest, context: Context
    ) -> pb.ListSessionEventsResponse:
        """Page through the stored log (bounded by count and by bytes)."""
        size = page_tokens.check_page_size(request.page_size, 500, 5000)
        selector = request.WhichOneof("selector")
        if selector is None:
            raise InvalidArgument("selector", "set agent_id or session_id")
        params = f"{selector}={getattr(request, selector)} from_seq={request.from_seq}"
        after = page_tokens.last_key(request.page_token, "ListSessionEvents", params)
        session = await self._session(request)
        if after is not None and not (after.isascii() and after.isdigit()):
            raise InvalidArgument("page_token", page_tokens.NOT_ISSUED)
        start = max(request.from_seq, FIRST_SEQ) if after is None else int(after) + 1
        events = await session.read(start, size, MAX_RESPONSE_BYTES)
        end = start + len(events)
        next_token = ""
        if events and end < session.durable:
            next_token = page_tokens.issue("ListSessionEvents", str(end - 1), params)
        return pb.ListSessionEventsResponse(events=events, next_page_token=next_token)

    async def StreamSessionEvents(  # type: ignore[override]  # bytes: see api_stream_wire
        self, request: pb.StreamSessionEventsRequest, context: Context
    ) -> AsyncIterator[pb.StreamSessionEventsResponse | bytes]:
        """Replay the stored log from `from_seq`, then follow it, with the agent's events."""
        try:
            session = await self._session(request)
            agent = self.factory.agents.get(session.agent_id) if request.agent_id else None
            if request.from_seq > session.durable:
                raise OutOfRange(
                    f"from_seq: {request.from_seq} is past the end of the log"
                    f" ({session.stored} events): no such event was ever appended"
                )
        except AgentLoopError as error:
            await abort(context, error)
            return
        live: deque[ae.AgentEvent] = deque(maxlen=LIVE_EVENT_BUFFER)
        dropped = [0]  # live events pushed out of the full buffer since the last batch

        def on_live(event: ae.AgentEvent) -> None:
            if len(live) == live.maxlen:
                dropped[0] += 1  # the append below pushes out the oldest
            live.append(event)  # never changed once emitted; the response copies it anyway
            session.wake_waiters()

        unsubscribe = agent.subscribe(on_live) if agent is not None else None
        cursor = max(request.from_seq, FIRST_SEQ)
        try:
            yield pb.StreamSessionEventsResponse(subscribed=True)
            while True:
                if cursor < session.durable or live or dropped[0]:
                    # Everything stored since the last batch goes in one response:
                    # a turn's burst of chunks costs one message, not one each.
                    events = await session.read_encoded(cursor, STREAM_BATCH, MAX_RESPONSE_BYTES)
                    cursor += len(events)
                    agent_events = list(live)
                    live.clear()
                    lost, dropped[0] = dropped[0], 0
                    yield response_bytes(events, agent_events, lost)  # no copy of the events
                    continue
                if request.replay_only:
                    return
                if not self._follows(session, agent):
                    if request.agent_id in self.factory.moved:
                        # Handed to another replica: resume there from the last seq.
                        await abort(context, Unavailable(
                            f'agent "{request.agent_id}" moved to another replica; resume'
                            " the stream from its last seq", "AGENT_MOVING",
                            agent_id=request.agent_id,
                        ))  # fmt: skip
                        return
                    if not request.session_id:
                        return
                    # Not driven here: maybe by another replica; follow it in the store.
                    stored = self.factory.catalogue.follow_stored(
                        session.session_id, cursor, MAX_RESPONSE_BYTES
                    )
                    async for batch in stored:
                        yield pb.StreamSessionEventsResponse(events=batch)
                    return
                if session.failure is not None:
                    await abort(context, session.failure)
                    return
                await session.wait_beyond(cursor)
                await _passes(COALESCE_PASSES)  # what this wake-up set going joins the batch
        finally:
            if unsubscribe is not None:
                unsubscribe()

    def _follows(self, session: SessionLog, agent: Agent | None) -> bool:
        """Whether more events may come: a live agent still drives the session."""
        if agent is not None:
            return not (agent.disposed and self.factory.sessions.get(session.session_id) is None)
        return self.factory.sessions.get(session.session_id) is session

    async def _session(self, request: Selecting) -> SessionLog:
        """The session a request's `selector` oneof names."""
        selector = request.WhichOneof("selector")
        if selector == "agent_id":
            return await self.factory.catalogue.current(self.factory.get(request.agent_id).session)
        if selector is None:
            raise InvalidArgument("selector", "set agent_id or session_id")
        return await self.factory.catalogue.session(request.session_id)
