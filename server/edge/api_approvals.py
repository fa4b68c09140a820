"""The approval RPCs of `AgentService`: ResolveApproval and ListApprovals."""

from __future__ import annotations

import re
from typing import Any

import grpc

from agentloop.v1 import agent_service_pb2 as pb
from agentloop.v1 import approval_pb2 as ap
from server.edge.status import mapped
from server.kernel.errors import InvalidArgument
from server.lifecycle.factory import AgentFactory
from server.loop.agent import Agent
from server.loop.approvals import BY_API, MAX_REASON_BYTES, ApprovalNotFound
from server.stores import RequestRecord

Context = grpc.aio.ServicerContext[Any, Any]

VIA = re.compile(r"[a-z0-9-]{1,32}")
"""Where an answer was given (`ResolveApprovalRequest.via`): recorded as `api:<via>`."""


class ApprovalMethods:
    """Answer and list an agent's pending approvals (mixed into the AgentService servicer)."""

    factory: AgentFactory

    @mapped
    async def ResolveApproval(
        self, request: pb.ResolveApprovalRequest, context: Context
    ) -> pb.ResolveApprovalResponse:
        """Allow once or reject a pending approval; answer once the resolution is durable."""
        agent = self.factory.get(request.agent_id)
        if not request.approval_id:
            raise InvalidArgument("approval_id", "must not be empty")
        if request.decision not in (ap.APPROVAL_DECISION_ALLOW_ONCE, ap.APPROVAL_DECISION_REJECT):
            raise InvalidArgument("decision", "must be APPROVAL_DECISION_ALLOW_ONCE or _REJECT")
        if request.reason and request.decision != ap.APPROVAL_DECISION_REJECT:
            raise InvalidArgument("reason", "is only taken with APPROVAL_DECISION_REJECT")
        if len(request.reason.encode()) > MAX_REASON_BYTES:
            raise InvalidArgument("reason", f"must be at most {MAX_REASON_BYTES} bytes")
        if request.via and not VIA.fullmatch(request.via):
            raise InvalidArgument("via", "must be 1 to 32 lowercase letters, digits and '-'")
        resolved_by = f"{BY_API}:{request.via}" if request.via else BY_API
        agent = self._holder(agent, request.approval_id)  # a sub-agent's, answered on its parent
        approvals = agent.approvals

        async def run() -> bytes:
            try:
                resolved = approvals.resolve(
                    request.approval_id,
                    request.decision,
                    request.reason,
                    resolved_by,
                    request.request_id,
                )
            except ApprovalNotFound:
                raise await approvals.refusal(request.approval_id) from None
            answer = pb.ResolveApprovalResponse(resolution=resolved)
            answer.next_seq = agent.session.count
            raw = answer.SerializeToString()
            if request.request_id:
                agent.session.record(
                    RequestRecord(agent.agent_id, request.request_id, "ResolveApproval", raw)
                )
            await agent.session.settle()
            return raw

        raw = await self.factory.runtime.requests.once(
            agent.agent_id, request.request_id, "ResolveApproval", run, agent
        )
        return pb.ResolveApprovalResponse.FromString(raw)

    def _holder(self, agent: Agent, approval_id: str) -> Agent:
        """The agent whose approval `approval_id` is pending: this one or a descendant."""
        if approval_id in agent.approvals.pending:
            return agent
        for child_id in self.factory.family.descendants(agent.agent_id):
            child = self.factory.agents.get(child_id)
            if child is not None and approval_id in child.approvals.pending:
                return child
        return agent

    @mapped
    async def ListApprovals(
        self, request: pb.ListApprovalsRequest, context: Context
    ) -> pb.ListApprovalsResponse:
        """The agent's pending approvals, oldest first; then its sub-agents', depth first."""
        agent = self.factory.get(request.agent_id)
        approvals = list(agent.approvals.list())
        for child_id in (
            self.factory.family.descendants(agent.agent_id) if request.include_children else []
        ):
            child = self.factory.agents.get(child_id)
            for pending in child.approvals.list() if child is not None else []:
                approval = ap.ApprovalRequested()
                approval.CopyFrom(pending)  # the child's own record stays as it is
                approval.agent_id = child_id  # answer it on the child
                approvals.append(approval)
        return pb.ListApprovalsResponse(approvals=approvals)
