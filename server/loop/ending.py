"""How a turn ends: every end reason of a turn is decided here.

A turn's end reason comes from one place, `conclude`, given what ended it: the last
step's verdict (run again, stop, interrupted, failed), every prompt blocked
(`Rejected`), or what threw out of the turn (`thrown`), read against the cancel state.
The rules, in order:

- disposal wins over a cancel (`disposed`, not `aborted`);
- a cancel ends the turn `aborted` with the cancel's reason (the step's own signal's,
  when the step saw it);
- a failure ends it `error`, and only the first failure of a turn is reported
  (`agent/error`); later ones are logged;
- a turn that completed after a max-tokens step ends `max_tokens` (`final_reason`).
"""

from __future__ import annotations

import asyncio
import logging

from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import Aborted, CodedError
from server.loop.agent import Agent
from server.loop.running import Interrupted, Rejected, StepFailed, Stop, Turn, Verdict
from server.observability.logs import fields

log = logging.getLogger(__name__)

DISPOSED = ev.TurnEndReason(disposed=ev.TurnDisposed())


def interruption(agent: Agent, turn: Turn, step_reason: str | None = None) -> Interrupted:
    """The verdict of a turn cut short: disposed, else aborted with the cancel's reason.

    `step_reason` is the reason the running step's own signal fired with, when it did.
    """
    if agent.disposed:
        return Interrupted(DISPOSED)
    reason = step_reason if step_reason is not None else (turn.scope.reason or "cancelled")
    return Interrupted(ev.TurnEndReason(aborted=ev.TurnAborted(reason=reason)))


def thrown(agent: Agent, turn: Turn, error: BaseException, interrupted: bool) -> Verdict:
    """The verdict of an error that threw out of the turn.

    `interrupted`: the error was the turn's own cancellation (its scope caught it). A
    cancellation that was not (a stray one from inside a seam or tool) fails this turn
    only.
    """
    if isinstance(error, asyncio.CancelledError) and not interrupted:
        return StepFailed(CodedError("a listener or tool was cancelled", "CANCELLED"))
    if agent.disposed and not turn.error_reported:
        return Interrupted(DISPOSED)
    if interrupted and turn.scope.reason is not None:
        return interruption(agent, turn)
    return StepFailed(error)


def conclude(agent: Agent, turn: Turn, verdict: Verdict) -> None:
    """Set the turn's end reason from what ended it."""
    match verdict:
        case Rejected(reason=reason):
            turn.reason = ev.TurnEndReason(rejected=ev.TurnRejected(reason=reason))
        case Interrupted(reason=reason):
            turn.reason = reason
        case StepFailed(error=error):
            fail(agent, turn, error)
        case Stop():
            pass  # completed, unless a failure said otherwise


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


def final_reason(turn: Turn) -> ev.TurnEndReason:
    """The reason `turn/end` records: a completed turn after a max-tokens step is `max_tokens`."""
    if turn.reason.WhichOneof("kind") == "completed" and turn.max_tokens:
        turn.reason = ev.TurnEndReason(max_tokens=ev.TurnMaxTokens())
    return turn.reason
