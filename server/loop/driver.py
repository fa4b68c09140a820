"""The driver: one task per agent that turns queued messages into turns and steps.

A turn drains every queued message, runs `agent/prompt-submit` on each, then runs
steps until the model stops asking for tools (or a seam says otherwise). A step is:
assemble the system prompt, compose the session prefix (once per loop instance), run
`agent/pre-step`, snapshot the history, `step/start`, stream one model request, run
the tool calls it asked for, drain steering, `step/end`, decide whether to continue.
Every turn that opened is closed with exactly one `turn/end` and then flushed.
"""

from __future__ import annotations

import asyncio
import functools

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from server.kernel import seams as S
from server.loop.agent import Agent
from server.loop.context import report_context
from server.loop.ending import conclude, interruption, thrown
from server.loop.inbox import QueuedMessage
from server.loop.running import Rejected, RunAgain, StepFailed, Stop, Turn, Verdict
from server.loop.step import prepare_step, run_step
from server.loop.turn import close_step, close_turn, drain_steering

LOOP_SOURCE = c.Source(kind="loop")


async def run_loop(agent: Agent) -> None:
    """Drive `agent` until it is disposed."""
    loop = agent.loop
    while not agent.disposed:
        await agent.inbox.wait()
        while loop.compaction is not None:  # a manual compaction is being recorded
            await asyncio.shield(loop.compaction)
        if agent.disposed:
            break
        if loop.cancel_reason is not None:  # cancelled before the turn could start
            loop.cancel_reason = None
            if not agent.inbox.queued:
                agent.settle_idle()
                continue
        agent.set_status(ae.AGENT_STATUS_RUNNING)
        if loop.cancel_reason is not None:  # a `running` listener cancelled
            loop.cancel_reason = None
            if not agent.inbox.queued:
                agent.set_status(ae.AGENT_STATUS_IDLE)
                continue
        terminal = await run_turn(agent)
        loop.cancel_reason = None
        late = agent.inbox.drain_steering()
        if terminal:
            agent.record_dropped(
                late, "steering after a terminal agent/turn-stop", abort_reason="turn-stop"
            )
        else:
            for item in late:  # steering that missed its turn becomes the next prompt
                agent.inbox.enqueue(item)
        if not agent.inbox.queued and not agent.disposed:
            agent.set_status(ae.AGENT_STATUS_IDLE)


async def run_turn(agent: Agent) -> bool:
    """Run one turn over every queued message; returns whether it stopped terminally."""
    session = agent.session
    turn = Turn(session.max_turn + 1, start_seq=len(session))
    batch = agent.inbox.drain_queued()
    if not batch:
        return False
    try:
        start = {"turn": turn.number, "trigger": ev.TRIGGER_KIND_MESSAGE, "source": batch[0].source}
        session.add_fields("turn_start", start)
    except Exception as error:  # a pre-turn failure: nothing was opened
        agent.report_error(turn.number, 0, error)
        return False
    agent.loop.turn = turn  # from here on, `cancel()` and disposal cancel its scope
    if agent.loop.cancel_reason is not None:  # a cancel came as the turn started
        turn.scope.mark(agent.loop.cancel_reason)
        agent.loop.cancel_reason = None
    if agent.disposed:
        turn.scope.mark(None)
    turn.unsubmitted = list(batch)
    try:
        with turn.scope:
            verdict = await submit_prompts(agent, turn, batch) or await run_steps(agent, turn)
        conclude(agent, turn, verdict)
    except (Exception, asyncio.CancelledError) as error:
        end_thrown_turn(agent, turn, error)
    finally:
        agent.loop.turn = None
    close_turn(agent, turn)
    if agent.context.window:  # a gauge needs a window: none is sent for an unknown one
        report_context(agent)
    try:
        await agent.runtime.persistence.flush(session)
    except Exception as error:
        agent.report_error(turn.number, turn.step, error)
    return turn.terminal


def end_thrown_turn(agent: Agent, turn: Turn, error: BaseException) -> None:
    """Close what a turn that threw left open, then conclude it (`ending.thrown`).

    The turn's own cancellation (caught by its scope: a seam call that gave up because
    the turn was cancelled or the agent disposed) interrupts it; a cancellation of the
    driver itself (a shutdown past its grace) propagates; any other cancellation is a
    stray one from inside a seam or tool: a failure of this turn only.
    """
    interrupted = turn.scope.caught(error)
    cancelled = isinstance(error, asyncio.CancelledError)
    stray = cancelled and not interrupted
    if stray:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise error
    close_step(agent, turn)
    if not stray and not agent.disposed:  # disposed: they stay pending, run when resumed
        why = turn.signal.reason if cancelled else error
        agent.record_dropped(turn.unsubmitted, f"the turn ended before it was submitted: {why}")
    conclude(agent, turn, thrown(agent, turn, error, interrupted))


async def submit_prompts(agent: Agent, turn: Turn, batch: list[QueuedMessage]) -> Rejected | None:
    """Run `agent/prompt-submit` on each message; `Rejected` when every one was blocked."""
    allowed = False
    last_block = ""
    for item in batch:
        decision = await agent.runtime.seams.waterfall(
            S.PROMPT_SUBMIT,
            agent.agent_id,
            functools.partial(
                S.PromptSubmit,
                agent,
                agent.session.open_turn,
                0,
                turn.signal,
                item.content,
                item.source,
            ),
            d.PromptDecision(),
        )
        turn.unsubmitted.remove(item)
        if decision.WhichOneof("decision") == "block":
            last_block = decision.block.reason
            agent.session.add(
                ev.PromptBlocked(
                    content=item.content,
                    source=item.source,
                    reason=last_block,
                    request_id=item.request_id,
                ),
                consumes=item.consumes,
            )
            continue
        allowed = True
        content = decision.allow.content or item.content
        message = {"content": content, "source": item.source, "request_id": item.request_id}
        agent.session.add_fields("user_message", message, consumes=item.consumes)
        for context in decision.allow.additional_contexts:
            agent.inject(context)
    return None if allowed else Rejected(last_block)


async def run_steps(agent: Agent, turn: Turn) -> Verdict:
    """Run steps until one's verdict ends the turn; that verdict."""
    while True:
        verdict = await run_one_step(agent, turn)
        if not isinstance(verdict, RunAgain):
            return verdict


async def run_one_step(agent: Agent, turn: Turn) -> Verdict:
    """One step, closed; then what comes next."""
    drain_steering(agent, turn)
    step = turn.begin_step()
    try:
        try:
            system, history = await prepare_step(agent, turn, step)
        except (Exception, asyncio.CancelledError) as error:
            if not turn.scope.caught(error):
                raise
            close_step(agent, turn)
            return interruption(agent, turn)
        try:
            outcome = await run_step(agent, turn, step, system, history)
        except (Exception, asyncio.CancelledError) as error:
            ours = turn.scope.caught(error)
            if isinstance(error, asyncio.CancelledError) and not ours:
                raise
            close_step(agent, turn)
            if agent.disposed or step.signal.aborted:
                return interruption(agent, turn, step.signal.reason)
            return StepFailed(error)
    finally:
        turn.current = None
    turn.max_tokens = turn.max_tokens or outcome.max_tokens
    steered = drain_steering(agent, turn)
    close_step(agent, turn)
    return await decide(agent, turn, outcome.had_tool_calls or steered)


async def decide(agent: Agent, turn: Turn, default_continue: bool) -> Verdict:
    """The continuation window: continuation waterfall, turn-stop checkpoint, cancel."""
    seams = agent.runtime.seams
    default = d.ContinuationDecision()  # its choice set in place: cheaper than nested
    (default.continue_turn if default_continue else default.stop).SetInParent()
    decision = await seams.waterfall(
        S.TURN_CONTINUATION,
        agent.agent_id,
        lambda: S.TurnContinuation(agent, turn.number, 0, turn.signal, default),
        default,
    )
    kind = decision.WhichOneof("decision") or default.WhichOneof("decision")
    if kind == "continue_turn" and decision.continue_turn.reason:
        source = decision.continue_turn.source
        reason = list(decision.continue_turn.reason)
        agent.inbox.steer(QueuedMessage(reason, source if source.kind else LOOP_SOURCE))
    proceed = kind == "continue_turn" or bool(agent.inbox.steering)
    stop = functools.partial(S.TurnStop, agent, turn.number, 0, turn.signal)
    if await seams.serial(S.TURN_STOP, agent.agent_id, stop) is not None:
        turn.terminal = True
        agent.record_dropped(
            agent.inbox.drain_steering(), "discarded by a terminal agent/turn-stop"
        )
        proceed = False
    if turn.scope.cancel_called:
        return interruption(agent, turn)
    return RunAgain() if proceed else Stop()
