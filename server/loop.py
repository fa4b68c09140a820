"""The driver: one task per agent that turns queued messages into turns and steps.

A turn drains every queued message, runs `agent/prompt-submit` on each, then runs
steps until the model stops asking for tools (or a seam says otherwise). A step is:
assemble the system prompt, compose the session prefix (once per loop instance), run
`agent/pre-step`, snapshot the history, `step/start`, stream one model request, run
the tool calls it asked for, drain steering, `step/end`, decide whether to continue.
Every turn that opened is closed with exactly one `turn/end` and then flushed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server import seams as S
from server.abort import AbortSignal
from server.agent import Agent, context_message
from server.assembly import MessageAssembler
from server.content import tool_calls_of, without_tool_calls
from server.errors import Aborted, CodedError
from server.inbox import Pending
from server.jsonvalue import to_struct
from server.models import ModelRequest
from server.scheduler import run_tool_batch
from server.system_prompt import PromptScope
from server.tools import ToolOutcome

log = logging.getLogger(__name__)

COMPLETED = ev.TurnEndReason(completed=ev.TurnCompleted())
LOOP_SOURCE = c.Source(kind="loop")


class StepInterrupted(Exception):
    """A checkpoint found the turn cancelled or the agent disposed."""


@dataclass
class Turn:
    """The state of one running turn."""

    number: int
    step: int = 0
    reason: ev.TurnEndReason = field(default_factory=lambda: COMPLETED)
    error_reported: bool = False
    max_tokens: bool = False
    step_open: bool = False
    terminal: bool = False


@dataclass(frozen=True)
class StepOutcome:
    """What a successful step did."""

    had_tool_calls: bool
    max_tokens: bool


async def run_loop(agent: Agent) -> None:
    """Drive `agent` until it is disposed."""
    while not agent.disposed:
        await agent.inbox.wait()
        if agent.disposed:
            break
        if agent.cancel_reason is not None:  # cancelled before the turn could start
            agent.cancel_reason = None
            if not agent.inbox.queued:
                agent.settle_idle()
                continue
        agent.set_status(ae.AGENT_STATUS_RUNNING)
        if agent.cancel_reason is not None:  # a `running` listener cancelled
            agent.cancel_reason = None
            if not agent.inbox.queued:
                agent.set_status(ae.AGENT_STATUS_IDLE)
                continue
        terminal = await run_turn(agent)
        agent.cancel_reason = None
        late = agent.inbox.drain_steering()
        if not terminal:
            for item in late:  # steering that missed its turn becomes the next prompt
                agent.inbox.enqueue(item)
        if not agent.inbox.queued and not agent.disposed:
            agent.set_status(ae.AGENT_STATUS_IDLE)


async def run_turn(agent: Agent) -> bool:
    """Run one turn over every queued message; returns whether it stopped terminally."""
    session = agent.session
    turn = Turn(session.max_turn + 1)
    batch = agent.inbox.drain_queued()
    if not batch:
        return False
    try:
        session.append(
            "turn_start",
            ev.TurnStart(turn=turn.number, trigger=ev.TRIGGER_KIND_MESSAGE, source=batch[0].source),
        )
    except Exception as error:  # a pre-turn failure: nothing was opened
        agent.report_error(turn.number, 0, error)
        return False
    try:
        if await submit_prompts(agent, turn, batch):
            await run_steps(agent, turn)
    except Exception as error:
        close_step(agent, turn)
        if agent.disposed and not turn.error_reported:
            turn.reason = ev.TurnEndReason(disposed=ev.TurnDisposed())
        else:
            fail(agent, turn, error)
    close_turn(agent, turn)
    try:
        await agent.runtime.persistence.flush(session)
    except Exception as error:
        agent.report_error(turn.number, turn.step, error)
    return turn.terminal


async def submit_prompts(agent: Agent, turn: Turn, batch: list[Pending]) -> bool:
    """Run `agent/prompt-submit` on each message; False when every one was blocked."""
    allowed = False
    last_block = ""
    for item in batch:
        decision = await agent.runtime.seams.waterfall(
            S.PROMPT_SUBMIT, agent.agent_id, (agent, item.content, item.source), d.PromptDecision()
        )
        if decision.WhichOneof("decision") == "block":
            last_block = decision.block.reason
            agent.session.append(
                "prompt_blocked",
                ev.PromptBlocked(content=item.content, source=item.source, reason=last_block),
            )
            continue
        allowed = True
        content = decision.allow.content or item.content
        agent.session.append("user_message", ev.UserMessage(content=content, source=item.source))
        for context in decision.allow.additional_contexts:
            agent.inject(context)
    if not allowed:
        turn.reason = ev.TurnEndReason(rejected=ev.TurnRejected(reason=last_block))
    return allowed


async def run_steps(agent: Agent, turn: Turn) -> None:
    """Run steps until the turn stops; sets `turn.reason` on every non-throwing exit."""
    while True:
        turn.step += 1
        drain_steering(agent, turn)
        signal = agent.new_step_signal()
        try:
            try:
                system, history = await prepare_step(agent, turn, signal)
            except StepInterrupted:
                close_step(agent, turn)
                interrupt(agent, turn)
                return
            try:
                outcome = await run_step(agent, turn, system, history)
            except Exception as error:
                close_step(agent, turn)
                if agent.disposed:
                    turn.reason = ev.TurnEndReason(disposed=ev.TurnDisposed())
                elif signal.aborted:
                    turn.reason = ev.TurnEndReason(aborted=ev.TurnAborted(reason=signal.reason))
                else:
                    fail(agent, turn, error)
                return
        finally:
            agent.step_controller = None
        turn.max_tokens = turn.max_tokens or outcome.max_tokens
        steered = drain_steering(agent, turn)
        close_step(agent, turn)
        if not await should_continue(agent, turn, outcome.had_tool_calls or steered):
            return


async def prepare_step(
    agent: Agent, turn: Turn, signal: AbortSignal
) -> tuple[str, list[c.Message]]:
    """Everything before the model call: prompt, prefix, pre-step, history, `step/start`.

    Raises `StepInterrupted` at each checkpoint that finds the turn cancelled or the
    agent disposed (also when a seam gave up because the step's signal fired).
    """
    runtime = agent.runtime
    session = agent.session
    try:
        scope = PromptScope(
            agent_id=agent.agent_id,
            provider=agent.options.provider or runtime.default_provider,
            model=agent.options.model,
            cwd=session.header.cwd,
        )
        assembly = await runtime.prompts.assemble(scope, runtime.seams)
        system = runtime.prompts.render(assembly)
        check_interrupted(agent)
        if agent.session_prefix is None:
            prefix: list[c.Message] = await runtime.seams.waterfall(
                S.SESSION_PREFIX, agent.agent_id, (agent, (), signal), []
            )
            check_interrupted(agent)  # an interrupted composition is not cached
            agent.session_prefix = [copy_message(m) for m in prefix]
        await runtime.seams.serial(
            S.PRE_STEP,
            agent.agent_id,
            (agent, turn.number, turn.step, system, agent.session_prefix, signal),
        )
        check_interrupted(agent)
    except Aborted:
        if signal.aborted:
            raise StepInterrupted from None
        raise
    history = session.derive_messages()
    session.append("step_start", ev.StepStart(turn=turn.number, step=turn.step))
    turn.step_open = True
    check_interrupted(agent)
    return system, history


async def should_continue(agent: Agent, turn: Turn, default_continue: bool) -> bool:
    """The continuation window: continuation waterfall, turn-stop checkpoint, cancel."""
    seams = agent.runtime.seams
    default = (
        d.ContinuationDecision(continue_turn=d.ContinuationContinue())
        if default_continue
        else d.ContinuationDecision(stop=d.ContinuationStop())
    )
    decision = await seams.waterfall(
        S.TURN_CONTINUATION, agent.agent_id, (agent, turn.number, default), default
    )
    kind = decision.WhichOneof("decision") or default.WhichOneof("decision")
    if kind == "continue_turn" and decision.continue_turn.reason:
        source = decision.continue_turn.source
        agent.inbox.steer(
            Pending(list(decision.continue_turn.reason), source if source.kind else LOOP_SOURCE)
        )
    proceed = kind == "continue_turn" or bool(agent.inbox.steering)
    if await seams.serial(S.TURN_STOP, agent.agent_id, (agent, turn.number)) is not None:
        turn.terminal = True
        agent.inbox.steering.clear()
        proceed = False
    if agent.cancel_reason is not None or agent.disposed:
        interrupt(agent, turn)
        return False
    return proceed


async def run_step(agent: Agent, turn: Turn, system: str, history: list[c.Message]) -> StepOutcome:
    """Stream one model request and run the tool calls it asked for."""
    runtime = agent.runtime
    session = agent.session
    signal = agent.step_signal()
    first_request = agent.requests_made == 0
    seed = (
        c.ModelConfig(
            provider=agent.options.provider or runtime.default_provider, model=agent.options.model
        )
        if first_request or session.request_header is None
        else session.request_header.config
    )
    config = await runtime.seams.waterfall(
        S.REQUEST, agent.agent_id, (agent, turn.number, turn.step, seed), seed
    )
    if not config.provider or not config.model:
        raise CodedError(
            f'agent "{agent.agent_id}" has no provider/model: provider="{config.provider}", '
            f'model="{config.model}"; set them in the agent options or from agent/request',
            "NO_MODEL",
        )
    header = c.RequestHeader(
        config=config,
        system=system,
        tools=runtime.tools.schemas(agent.agent_id, agent.enabled_tools, runtime.tool_order),
        message_prefix=agent.session_prefix or (),
    )
    log_header(agent, header, first_request)
    agent.requests_made += 1
    model = runtime.models.get(config.provider)
    request = ModelRequest(
        agent_id=agent.agent_id,
        session_id=session.session_id,
        turn=turn.number,
        step=turn.step,
        header=header,
        messages=[*header.message_prefix, *history],
        options=agent.options,
    )
    assembler = MessageAssembler()
    chunk_seqs: list[int] = []
    chunks = model.stream(request, signal)
    try:
        async for chunk in chunks:
            signal.raise_if_aborted()
            event = session.append(
                "assistant_chunk", ev.AssistantChunk(turn=turn.number, step=turn.step, chunk=chunk)
            )
            chunk_seqs.append(event.seq)
            assembler.add(chunk)
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()  # stop the provider's stream at once on abort
    signal.raise_if_aborted()
    finish = assembler.finish
    if finish is None:
        raise CodedError("model stream ended without a finish chunk", "MODEL_PROTOCOL")
    if finish.kind == st.FINISH_KIND_ERROR:
        raise CodedError(finish.message or "model error", finish.code)
    if finish.kind == st.FINISH_KIND_ABORTED:
        raise CodedError("model stream aborted", "ABORTED")
    max_tokens = finish.kind == st.FINISH_KIND_MAX_TOKENS
    provenance = c.Provenance(provider=config.provider, model=config.model)
    assembled = assembler.content
    if max_tokens:
        assembled = without_tool_calls(assembled)
    message = c.Message(role=c.ROLE_ASSISTANT, content=assembled, provenance=provenance)
    try:
        result = await runtime.seams.waterfall(
            S.STEP_RESULT, agent.agent_id, (agent, turn.number, turn.step, message), message
        )
    except Exception:
        append_assistant(agent, turn, [], provenance, assembler.usage, chunk_seqs)
        raise
    content = list(result.content)
    if max_tokens:
        content = without_tool_calls(content)
    if result is not message and list(result.content) != list(message.content):
        provenance.replay_state = ""  # replay state only fits the content it came with
    append_assistant(agent, turn, content, provenance, assembler.usage, chunk_seqs)
    calls = [] if max_tokens else tool_calls_of(content)
    if not calls:
        return StepOutcome(had_tool_calls=False, max_tokens=max_tokens)
    await run_tools(agent, turn, calls)
    return StepOutcome(had_tool_calls=True, max_tokens=False)


async def run_tools(agent: Agent, turn: Turn, calls: list[c.ToolCallBlock]) -> None:
    """Run one tool batch; deferred contexts are appended after its results, even on abort."""
    session = agent.session

    def on_call(call: c.ToolCallBlock) -> int:
        return session.append(
            "tool_call",
            ev.ToolCall(
                turn=turn.number,
                step=turn.step,
                call_id=call.id,
                name=call.name,
                arguments=call.arguments,
            ),
        ).seq

    def on_result(call: c.ToolCallBlock, outcome: ToolOutcome, call_seq: int) -> None:
        result = ev.ToolResult(
            turn=turn.number,
            step=turn.step,
            call_id=call.id,  # the model's id, whatever a listener did to the content
            content=outcome.content,
            is_error=outcome.is_error,
            error=outcome.error,
        )
        if outcome.meta is not None:
            result.meta.CopyFrom(to_struct(outcome.meta))
        session.append("tool_result", result, source_event_seqs=[call_seq])

    def on_context(context: d.HookContext) -> None:
        agent.deferred.append(context_message(context))

    agent.tool_batch_active = True
    try:
        await run_tool_batch(
            calls,
            registry=agent.runtime.tools,
            seams=agent.runtime.seams,
            agent_id=agent.agent_id,
            enabled=agent.enabled_tools,
            turn=turn.number,
            step=turn.step,
            signal=agent.step_signal(),
            max_parallel=agent.max_parallel_tool_calls,
            on_call=on_call,
            on_result=on_result,
            on_context=on_context,
        )
    finally:
        agent.tool_batch_active = False
        deferred, agent.deferred = agent.deferred, []
        for message in deferred:
            session.append("context_message", message)


def log_header(agent: Agent, header: c.RequestHeader, first_request: bool) -> None:
    """Append `request/header` when this request owes one (first of instance, or changed)."""
    logged = agent.session.request_header
    if first_request:
        reason = ev.HEADER_REASON_INITIAL if logged is None else ev.HEADER_REASON_RESUME
    elif logged is None or logged != header:
        reason = ev.HEADER_REASON_CHANGE
    else:
        return
    agent.session.append("request_header", ev.RequestHeaderLogged(header=header, reason=reason))


def append_assistant(
    agent: Agent,
    turn: Turn,
    content: list[c.ContentBlock],
    provenance: c.Provenance,
    usage: c.Usage | None,
    chunk_seqs: list[int],
) -> None:
    """Append the step's `assistant/message` (empty content is a completion anchor)."""
    message = ev.AssistantMessage(
        turn=turn.number, step=turn.step, content=content, provenance=provenance, usage=usage
    )
    agent.session.append("assistant_message", message, source_event_seqs=chunk_seqs)


def drain_steering(agent: Agent, turn: Turn) -> bool:
    """Record every pending steering item; True if there was any."""
    items = agent.inbox.drain_steering()
    for item in items:
        agent.session.append(
            "steering_message",
            ev.SteeringMessage(turn=turn.number, content=item.content, source=item.source),
        )
    return bool(items)


def copy_message(message: c.Message) -> c.Message:
    """A detached copy, so that a listener's later mutation cannot reach the cache."""
    copy = c.Message()
    copy.CopyFrom(message)
    return copy


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
        log.warning("agent %s turn %d: further failure: %s", agent.agent_id, turn.number, error)
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
        agent.session.append("step_end", end)
    except Exception as error:
        fail(agent, turn, error)
        agent.session.append("step_end", end)
    turn.step_open = False


def close_turn(agent: Agent, turn: Turn) -> None:
    """Append the one `turn/end` (retried once if vetoed, keeping the first error)."""
    if turn.reason.WhichOneof("kind") == "completed" and turn.max_tokens:
        turn.reason = ev.TurnEndReason(max_tokens=ev.TurnMaxTokens())
    try:
        agent.session.append("turn_end", ev.TurnEnd(turn=turn.number, reason=turn.reason))
    except Exception as error:
        fail(agent, turn, error)
        agent.session.append("turn_end", ev.TurnEnd(turn=turn.number, reason=turn.reason))
