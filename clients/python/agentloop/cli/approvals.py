"""The CLI's approval verbs: `approve` and `reject`, and the prompt `send` shows.

`agentloop send` shows each approval request of its turn. On a terminal it asks
`allow once? [y/N]` and answers (anything but y or yes rejects); otherwise (a pipe, a
script, `--json`) it only shows the request, for `agentloop approve AGENT APPROVAL_ID`
or `agentloop reject AGENT APPROVAL_ID [--reason TEXT]` from another terminal. An
approval answered elsewhere first (another terminal, an approver plugin, the timeout)
is reported, not an error, in `send`; `approve` and `reject` exit 2 with the status.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import Any

import grpc

from agentloop.cli.verbs import emit, out
from agentloop.client import Client
from agentloop.v1 import agent_service_pb2, approval_pb2
from agentloop.v1 import session_event_pb2 as ev

APPROVAL_KINDS = frozenset({"approval_requested", "approval_resolved"})

OUTCOME_WORDS = {
    approval_pb2.APPROVAL_OUTCOME_ALLOWED_ONCE: "allowed once",
    approval_pb2.APPROVAL_OUTCOME_REJECTED: "rejected",
    approval_pb2.APPROVAL_OUTCOME_CANCELLED: "cancelled",
    approval_pb2.APPROVAL_OUTCOME_TIMED_OUT: "timed out",
}


def request_text(request: approval_pb2.ApprovalRequested) -> str:
    """An approval request in one line."""
    why = f" ({request.reason})" if request.reason else ""
    return (
        f"? approval {request.approval_id}: {request.tool_name}({request.arguments}){why}"
        f", asked by {request.requested_by}"
    )


def resolved_text(resolved: approval_pb2.ApprovalResolved) -> str:
    """How an approval ended, in one line."""
    outcome = OUTCOME_WORDS.get(resolved.outcome, str(resolved.outcome))
    why = f": {resolved.reason}" if resolved.reason else ""
    return f"✓ approval {resolved.approval_id} {outcome} by {resolved.resolved_by}{why}"


async def resolve(
    client: Client,
    args: argparse.Namespace,
    approval_id: str,
    decision: approval_pb2.ApprovalDecision.ValueType,
    reason: str = "",
) -> agent_service_pb2.ResolveApprovalResponse:
    """Call ResolveApproval."""
    return await client.agents.ResolveApproval(
        agent_service_pb2.ResolveApprovalRequest(
            agent_id=args.agent_id,
            approval_id=approval_id,
            decision=decision,
            reason=reason,
            via="cli",  # recorded as resolved by `api:cli`
        ),
        timeout=client.timeout,
    )


async def on_send_event(
    client: Client,
    args: argparse.Namespace,
    event: ev.SessionEvent,
    ask: Callable[[str], str] = input,
) -> None:
    """During `send`: show an approval event; on a terminal, answer a request."""
    kind = event.WhichOneof("payload")
    if kind not in APPROVAL_KINDS or args.json:
        return
    if kind == "approval_resolved":
        out(resolved_text(event.approval_resolved) + "\n")
        return
    request = event.approval_requested
    out(request_text(request) + "\n")
    if not sys.stdin.isatty():
        out(f"  answer with: agentloop approve|reject {args.agent_id} {request.approval_id}\n")
        return
    try:  # in a thread: the stream and Ctrl-C stay served while the person thinks
        answer = (await asyncio.to_thread(ask, "  allow once? [y/N] ")).strip().lower()
    except EOFError:
        answer = ""
    decision = (
        approval_pb2.APPROVAL_DECISION_ALLOW_ONCE
        if answer in ("y", "yes")
        else approval_pb2.APPROVAL_DECISION_REJECT
    )
    try:
        await resolve(client, args, request.approval_id, decision)
    except grpc.aio.AioRpcError as error:
        if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
            raise
        out(f"  already answered: {error.details()}\n")


async def cmd_approve(client: Client, args: argparse.Namespace) -> int:
    """`approve AGENT APPROVAL_ID`: allow the waiting tool call once."""
    decision = approval_pb2.APPROVAL_DECISION_ALLOW_ONCE
    answer = await resolve(client, args, args.approval_id, decision)
    emit(args, answer, resolved_text(answer.resolution) + "\n")
    return 0


async def cmd_reject(client: Client, args: argparse.Namespace) -> int:
    """`reject AGENT APPROVAL_ID [--reason TEXT]`: reject the waiting tool call."""
    decision = approval_pb2.APPROVAL_DECISION_REJECT
    answer = await resolve(client, args, args.approval_id, decision, args.reason)
    emit(args, answer, resolved_text(answer.resolution) + "\n")
    return 0


async def cmd_approvals(client: Client, args: argparse.Namespace) -> int:
    """`approvals AGENT`: list the tool calls waiting for approval."""
    listed = await client.agents.ListApprovals(
        agent_service_pb2.ListApprovalsRequest(agent_id=args.agent_id), timeout=client.timeout
    )
    text = "".join(request_text(r) + "\n" for r in listed.approvals) or "no pending approvals\n"
    emit(args, listed, text)
    return 0


def add_approval_verbs(command: Callable[[str, Any, str], argparse.ArgumentParser]) -> None:
    """Add `approve`, `reject` and `approvals` through the CLI's `command(...)`."""
    approve = command("approve", cmd_approve, "allow a tool call waiting for approval, once")
    reject = command("reject", cmd_reject, "reject a tool call waiting for approval")
    for verb in (approve, reject):
        verb.add_argument("agent_id", metavar="AGENT_ID")
        verb.add_argument("approval_id", metavar="APPROVAL_ID")
    reject.add_argument("--reason", default="", help="why; the model sees it")
    approvals = command("approvals", cmd_approvals, "list the tool calls waiting for approval")
    approvals.add_argument("agent_id", metavar="AGENT_ID")
