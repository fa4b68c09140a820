"""How a turn records steering, interruptions and failures, and how it closes.

Its state is `server.loop.running.Turn`.
"""

from __future__ import annotations

import logging

from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import Aborted, CodedError
from server.loop.agent import Agent
from server.loop.running import Turn
from server.observability.logs import fields

log = logging.getLogger(__name__)


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


def interruption(agent: Agent, turn: Turn) -> ev.TurnEndReason:
    """The end reason of an interrupted turn: disposal wins over cancel."""
    if agent.disposed:
        return ev.TurnEndReason(disposed=ev.TurnDisposed())
    reason = turn.scope.reason or "cancelled"
    return ev.TurnEndReason(aborted=ev.TurnAborted(reason=reason))


def interrupt(agent: Agent, turn: Turn) -> None:
    """Set the reason of an interrupted turn."""
    turn.reason = interruption(agent, turn)


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
