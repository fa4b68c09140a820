"""What a running agent owns, scoped by how long it lives: the loop, a turn, a step.

- `LoopState`: one per loop instance (an agent's driver, from its start or resume to
  its disposal): the session prefix composed on its first step, the model requests it
  made (the first of an instance logs a header), the marker of a cancel that came
  before a turn began, the running turn.
- `Turn`: one per turn: its number, its cancel scope, how it will end, its open step.
- `Step`: one per step: its abort signal (fired by the turn's scope while the step
  runs), and the contexts held back while its tool batch runs.

After each step the loop decides what comes next (`Verdict`): run another step, stop,
stop interrupted (cancelled or disposed), or stop failed; a turn whose every prompt was
blocked is `Rejected`. `server/loop/ending.py` turns the last verdict into the end reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.abort import AbortController, AbortSignal
from server.kernel.cancel import CancelScope
from server.loop.inbox import QueuedMessage


@dataclass(eq=False)
class Step:
    """The state of one running step."""

    number: int
    controller: AbortController = field(default_factory=AbortController)
    """The step's abort signal: the turn's scope fires it when cancelled during the step."""
    tool_batch_active: bool = False
    """While set, an injected context waits for the batch's results (`deferred`)."""
    deferred: list[tuple[ev.ContextMessage, tuple[int, ...]]] = field(default_factory=list)
    """Contexts held back while the tool batch runs (with the inbox entries they record),
    appended after its results."""

    @property
    def signal(self) -> AbortSignal:
        """Fires when the step is cancelled or the agent disposed."""
        return self.controller.signal


@dataclass(eq=False)
class Turn:
    """The state of one running turn."""

    number: int
    step: int = 0
    """The number of the current (or last) step; 0 before the first."""
    start_seq: int = 0
    """The session length when the turn began: what it appended is counted from here."""
    scope: CancelScope = field(default_factory=CancelScope)
    """The turn's cancel scope: `cancel()` and disposal cancel it; every seam call of
    the turn watches its signal."""
    current: Step | None = None
    """The step running now (None between steps)."""
    reason: ev.TurnEndReason = field(
        default_factory=lambda: ev.TurnEndReason(completed=ev.TurnCompleted())
    )
    error_reported: bool = False
    max_tokens: bool = False
    step_open: bool = False
    terminal: bool = False
    unsubmitted: list[QueuedMessage] = field(default_factory=list)
    """Drained messages that prompt-submit has not recorded yet."""

    @property
    def signal(self) -> AbortSignal:
        """Fires when the turn is cancelled or the agent disposed."""
        return self.scope.signal

    def begin_step(self) -> Step:
        """Number and open the scope of the next step."""
        self.step += 1
        self.current = Step(self.step)
        return self.current

    def cancel(self, reason: str) -> None:
        """Cancel the turn's scope, and fire the running step's signal, with `reason`."""
        self.scope.cancel(reason)
        if self.current is not None:
            self.current.controller.abort(reason)


@dataclass(eq=False)
class LoopState:
    """The state of one loop instance (one driver of one agent)."""

    session_prefix: list[c.Message] | None = None
    """The session prefix of this loop instance, composed on its first step."""
    requests_made: int = 0
    """Model requests made by this loop instance (0: the next one logs a header)."""
    header: c.RequestHeader | None = None
    """The request header of the last request, reused while `header_inputs` are equal
    (a header is built and compared only when what it is made of changed)."""
    header_inputs: tuple[object, ...] = ()
    """What `header` was built from, but its config (compared apart)."""
    header_logged: tuple[c.RequestHeader, c.RequestHeader] | None = None
    """A header known equal to the session's logged one, and that logged one."""
    cancel_reason: str | None = None
    """The marker of a cancel with no turn to cancel yet (set by `cancel()` when there
    is work): the next turn's scope takes it over, or the loop drops it when no turn
    starts. A cancel during a turn cancels the turn's scope instead."""
    turn: Turn | None = None
    """The running turn."""
    compaction: asyncio.Future[None] | None = None
    """A manual compaction of the idle agent, until it is recorded: the next turn waits
    for it (a turn never starts under a compaction, nor a compaction under a turn)."""


# -- what comes after a step -------------------------------------------------------------


@dataclass(frozen=True)
class RunAgain:
    """Run another step."""


@dataclass(frozen=True)
class Stop:
    """The turn ends with the reason it has (completed unless something said otherwise)."""


@dataclass(frozen=True)
class Interrupted:
    """The turn was cancelled or the agent disposed: it ends with `reason`."""

    reason: ev.TurnEndReason


@dataclass(frozen=True)
class Rejected:
    """Every prompt of the turn was blocked: it ends `rejected` with the last reason."""

    reason: str


@dataclass(frozen=True)
class StepFailed:
    """A step failed: the turn ends with its error."""

    error: BaseException


Verdict = RunAgain | Stop | Interrupted | Rejected | StepFailed
"""What the loop does after a step, or (not `RunAgain`) what ended the turn."""
