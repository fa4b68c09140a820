"""The DeleteSession RPC of `AgentService` (mixed into its servicer)."""

from __future__ import annotations

from typing import Any

import grpc

from agentloop.v1 import agent_service_pb2 as pb
from server.edge.status import mapped
from server.kernel.ids import check_id
from server.lifecycle.deletion import DELETE_SCOPE, Deleted, delete_session
from server.lifecycle.factory import AgentFactory
from server.stores import RequestRecord

Context = grpc.aio.ServicerContext[Any, Any]

METHOD = "DeleteSession"


class DeleteMethods:
    """Delete a stored session (mixed into the AgentService servicer)."""

    factory: AgentFactory

    @mapped
    async def DeleteSession(
        self, request: pb.DeleteSessionRequest, context: Context
    ) -> pb.DeleteSessionResponse:
        """Delete a session; answer once it is gone from the store."""
        check_id("session_id", request.session_id)
        scope = DELETE_SCOPE + request.session_id
        request_id = request.request_id
        answers: list[pb.DeleteSessionResponse] = []

        def answer(deleted: Deleted) -> RequestRecord:
            raw = response_of(deleted).SerializeToString()
            return RequestRecord(scope, request_id, METHOD, raw)

        async def run() -> bytes:
            deleted = await delete_session(
                self.factory,
                request.session_id,
                dispose=request.dispose_agent,
                answer=answer if request_id else None,
            )
            response = response_of(deleted)
            answers.append(response)
            return response.SerializeToString()

        raw = await self.factory.runtime.requests.once(scope, request_id, METHOD, run)
        return answers[0] if answers else pb.DeleteSessionResponse.FromString(raw)


def response_of(deleted: Deleted) -> pb.DeleteSessionResponse:
    """The answer of a delete."""
    return pb.DeleteSessionResponse(
        session_id=deleted.session_id,
        deleted_events=deleted.events,
        disposed_agent_id=deleted.disposed_agent_id,
    )
