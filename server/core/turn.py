"""The state of a running turn, and how a turn records its failures and closes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from agentloop.v1 import session_event_pb2 as ev
from server.core.agent import Agent
from server.core.errors import Aborted, CodedError
from server.core.inbox import Pending
from server.observability.logs import fields

log = logging.getLogger(__name__)


class StepInterrupted(Exception):
    """A checkpoint found the turn cancelled or the agent disposed."""


@dataclass
class Turn:
    """The state of one running turn."""

    number: int
    step: int = 0
    start_seq: int = 0
    """The session length when the turn began: what it appended is counted from here."""
    reason: ev.TurnEndReason = field(
        default_factory=lambda: ev.TurnEndReason(completed=ev.TurnCompleted())
    )
    error_reported: bool = False
    max_tokens: bool = False
    step_open: bool = False
    terminal: bool = False
    unsubmitted: list[Pending] = field(default_factory=list)
    """Drained messages that prompt-submit has not recorded yet."""


def drain_steering(agent: Agent, turn: Turn) -> bool:
    """Record every pending steering item; True if there was any."""
    items = agent.inbox.drain_steering()
    for item in items:
        agent.session.add(
            ev.SteeringMessage(
                turn=turn.number,
                content=item.content,
                source=item.source,
                request_id=item.request_id,
            ),
            consumes=item.consumes,
        )
    return bool(items)


def check_interrupted(agent: Agent) -> None:
    """Raise `StepInterrupted` when the turn was cancelled or the agent disposed."""
    if agent.disposed or agent.cancel_reason is not None:
        raise StepInterrupted


def interrupt(agent: Agent, turn: Turn) -> None:
    """Set the reason of an interrupted turn: disposal wins over cancel."""
    if agent.disposed:
        turn.reason = ev.TurnEndReason(disposed=ev.TurnDisposed())
    else:
        reason = agent.cancel_reason or "cancelled"
        turn.reason = ev.TurnEndReason(aborted=ev.TurnAborted(reason=reason))


def fail(agent: Agent, turn: Turn, error: BaseException) -> None:
    """Record the turn's one error; later failures of the same turn are only logged."""
    if turn.error_reported:
        log.warning(
            "agent %s turn %d: further failure: %s", agent.agent_id, turn.number, error,
            extra=fields(agent=agent.agent_id, session=agent.session.session_id, turn=turn.number),
        )  # fmt: skip
        return
    turn.error_reported = True
    if isinstance(error, Aborted):
        message, code = f"aborted: {error.reason}", "ABORTED"
    else:
        message = str(error) or type(error).__name__
        code = error.code if isinstance(error, CodedError) else ""
    turn.reason = ev.TurnEndReason(error=ev.TurnError(step=turn.step, message=message, code=code))
    agent.report_error(turn.number, turn.step, error)


def close_step(agent: Agent, turn: Turn) -> None:
    """Append `step/end` if a step is open (retried once if vetoed)."""
    if not turn.step_open:
        return
    end = ev.StepEnd(turn=turn.number, step=turn.step)
    try:
        agent.session.add(end)
    except Exception as error:
        fail(agent, turn, error)
        agent.session.add(end)
    turn.step_open = False


def close_turn(agent: Agent, turn: Turn) -> None:
    """Append the one `turn/end` (retried once if vetoed, keeping the first error)."""
    if turn.reason.WhichOneof("kind") == "completed" and turn.max_tokens:
        turn.reason = ev.TurnEndReason(max_tokens=ev.TurnMaxTokens())
    try:
        agent.session.add(ev.TurnEnd(turn=turn.number, reason=turn.reason))
    except Exception as error:
        fail(agent, turn, error)
        agent.session.add(ev.TurnEnd(turn=turn.number, reason=turn.reason))
