"""The session verbs of the facade: read a session, its stored events, follow it, fork it."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from agentloop.errors import call
from agentloop.stream import SessionStream
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2, session_pb2

if TYPE_CHECKING:
    from agentloop.v1.agent_service_pb2_grpc import AgentServiceAsyncStub


class SessionReads:
    """The session RPCs as verbs (`Client` has them).

    `GetSession`, `ListSessions`, `ListSessionEvents`, `StreamSessionEvents`,
    `ForkSession`.
    """

    timeout: float | None
    """The deadline of each unary call, in seconds (None: no deadline)."""

    @property
    def agents(self) -> AgentServiceAsyncStub:
        """The `AgentService` stub (the client's)."""
        raise NotImplementedError

    async def get_session(self, *, agent_id: str = "", session_id: str = "") -> session_pb2.Session:
        """A session by its live agent's id or by its own id."""
        request = api.GetSessionRequest()
        _select(request, agent_id, session_id)
        return (await call(self.agents.GetSession(request, timeout=self.timeout))).session

    async def list_sessions(
        self,
        *,
        agent_id: str = "",
        live: bool | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        end_reason: str = "",
        id_contains: str = "",
    ) -> list[session_pb2.Session]:
        """The stored sessions that pass every filter given, following the pages.

        `live` True keeps the sessions a live agent drives, False those none
        drives; `created_after` is inclusive, `created_before` exclusive (an aware
        datetime; a naive one is taken as UTC); `end_reason` is a `TurnEndReason`
        kind ("completed", "error", …) or "none"; `id_contains` ignores case.
        """
        sessions: list[session_pb2.Session] = []
        token = ""
        while True:
            request = api.ListSessionsRequest(
                page_token=token,
                agent_id=agent_id,
                end_reason=end_reason,
                id_contains=id_contains,
            )
            if live is not None:
                request.live = live
            if created_after is not None:
                request.created_after.FromDatetime(created_after)
            if created_before is not None:
                request.created_before.FromDatetime(created_before)
            page = await call(self.agents.ListSessions(request, timeout=self.timeout))
            sessions.extend(page.sessions)
            if not (token := page.next_page_token):
                return sessions

    async def list_events(
        self, *, agent_id: str = "", session_id: str = "", from_seq: int = 0
    ) -> list[session_event_pb2.SessionEvent]:
        """A session's stored events from `from_seq`, following the pages."""
        events: list[session_event_pb2.SessionEvent] = []
        token = ""
        while True:
            request = api.ListSessionEventsRequest(from_seq=from_seq, page_token=token)
            _select(request, agent_id, session_id)
            page = await call(self.agents.ListSessionEvents(request, timeout=self.timeout))
            events.extend(page.events)
            if not (token := page.next_page_token):
                return events

    def stream(
        self,
        *,
        agent_id: str = "",
        session_id: str = "",
        from_seq: int = 0,
        replay_only: bool = False,
    ) -> SessionStream:
        """A session's events from `from_seq`, reconnecting after a failure.

        By `agent_id` (the live agent's session, with its live agent events) or by
        `session_id`; `replay_only` ends it at the end of the stored log.
        """
        return SessionStream(
            lambda: self.agents,
            agent_id=agent_id,
            session_id=session_id,
            from_seq=from_seq,
            replay_only=replay_only,
        )

    async def fork(
        self, session_id: str, boundary_seq: int | None = None, new_session_id: str = ""
    ) -> session_pb2.Session:
        """A new stored session with `session_id`'s events up to a `turn_end`."""
        request = api.ForkSessionRequest(
            session_id=session_id, boundary_seq=boundary_seq, new_session_id=new_session_id
        )
        return (await call(self.agents.ForkSession(request, timeout=self.timeout))).session


def _select(
    request: api.GetSessionRequest | api.ListSessionEventsRequest, agent_id: str, session_id: str
) -> None:
    """Set the `selector` oneof of a session request: exactly one of the two ids."""
    if bool(agent_id) == bool(session_id):
        raise ValueError("give exactly one of agent_id or session_id")
    if agent_id:
        request.agent_id = agent_id
    else:
        request.session_id = session_id
