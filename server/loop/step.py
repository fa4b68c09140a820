"""One step: prepare (prompt, prefix, pre-step, `step/start`), stream the model, run tools."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st
from server.kernel import seams as S
from server.kernel.assembly import MessageAssembler
from server.kernel.content import text_block, tool_calls_of, without_tool_calls
from server.kernel.errors import CodedError
from server.kernel.fairness import due, yield_if_due
from server.kernel.history import MessageView
from server.kernel.jsonvalue import to_struct
from server.kernel.limits import (
    CONTENT_BYTES,
    check_model_output,
    check_tool_calls,
    check_turn_events,
    oversized_result,
)
from server.kernel.tools import ToolExecution, ToolOutcome
from server.loop.agent import Agent, context_message
from server.loop.compaction import OVERFLOW_CODES
from server.loop.compaction_triggers import after_overflow, before_request
from server.loop.running import Step, Turn
from server.loop.scheduler import Ran, ToolBatch, run_tool_batch
from server.loop.system_prompt import PromptScope
from server.loop.tool_pipeline import ToolPipeline
from server.loop.tool_progress import ProgressReports
from server.models import ModelRequest


@dataclass(frozen=True)
class StepOutcome:
    """What a successful step did."""

    had_tool_calls: bool
    max_tokens: bool


async def prepare_step(agent: Agent, turn: Turn, step: Step) -> tuple[str, MessageView]:
    """Everything before the model call: prompt, prefix, pre-step, history, `step/start`.

    Each checkpoint raises the turn's cancellation (`CancelledError`) when the turn was
    cancelled or the agent disposed; a cancel while a seam awaits ends it there.
    """
    runtime = agent.runtime
    session = agent.session
    loop = agent.loop
    signal = step.signal
    checkpoint = turn.scope.checkpoint
    await yield_if_due()  # a turn of many steps that never wait must not starve the others
    if runtime.until_acting is not None:  # a replica woken from a pause: not before it
        await runtime.until_acting()  # knows which of its agents are still its own
    scope = PromptScope(
        agent_id=agent.agent_id,
        provider=agent.resolved_provider,
        model=agent.resolved_model,
        cwd=session.header.cwd,
    )
    system = await runtime.prompts.system_text(scope, runtime.seams)
    checkpoint()
    if loop.session_prefix is None:
        prefix = await runtime.seams.waterfall(
            S.SESSION_PREFIX,
            agent.agent_id,
            lambda: S.SessionPrefix(agent, session.open_turn, 0, signal),
            [],
        )
        checkpoint()  # an interrupted composition is not cached
        loop.session_prefix = [copy_message(m) for m in prefix]
    await runtime.seams.serial(
        S.PRE_STEP,
        agent.agent_id,
        lambda: S.PreStep(agent, turn.number, turn.step, signal, system, loop.session_prefix or ()),
    )
    checkpoint()
    if agent.context.compact_at:  # 0: the window is unknown, or automatic compaction off
        await before_request(agent, turn, step)
        checkpoint()
    history = session.history()  # a snapshot without a copy: no cost per message
    check_turn_events(runtime.limits, len(session) - turn.start_seq)
    session.add_fields("step_start", {"turn": turn.number, "step": turn.step})
    turn.step_open = True
    checkpoint()
    return system, history


async def run_step(
    agent: Agent, turn: Turn, step: Step, system: str, history: MessageView
) -> StepOutcome:
    """Stream one model request and run the tool calls it asked for."""
    config, request = await prepare_request(agent, turn, step, system, history)
    model = agent.runtime.models.get(config.provider)  # before the header: none for no request
    log_header(agent, request.header, agent.loop.requests_made == 0)
    agent.loop.requests_made += 1
    chunks = model.stream(request, step.signal)
    try:
        assembler, chunk_seqs = await stream_model(agent, turn, chunks)
    except CodedError as error:
        if error.code not in OVERFLOW_CODES:
            raise
        assembler, chunk_seqs = await retry_after_overflow(agent, turn, step, system, error)
    finish = assembler.finish
    if finish is not None and finish.code in OVERFLOW_CODES:  # an ERROR finish saying so
        overflow = CodedError(finish.message or "context length exceeded", finish.code)
        assembler, chunk_seqs = await retry_after_overflow(agent, turn, step, system, overflow)
        finish = assembler.finish
    if finish is None:
        raise CodedError("model stream ended without a finish chunk", "MODEL_PROTOCOL")
    if finish.kind == st.FINISH_KIND_ERROR:
        raise CodedError(finish.message or "model error", finish.code)
    if finish.kind == st.FINISH_KIND_ABORTED:
        raise CodedError("model stream aborted", "ABORTED")
    max_tokens = finish.kind == st.FINISH_KIND_MAX_TOKENS
    provenance = c.Provenance(provider=config.provider, model=config.model)
    calls = await commit_message(agent, turn, step, assembler, provenance, chunk_seqs, max_tokens)
    if not calls:
        return StepOutcome(had_tool_calls=False, max_tokens=max_tokens)
    await run_tools(agent, turn, step, calls)
    return StepOutcome(had_tool_calls=True, max_tokens=False)


async def retry_after_overflow(
    agent: Agent, turn: Turn, step: Step, system: str, overflow: CodedError
) -> tuple[MessageAssembler, list[int]]:
    """Compact after the provider's overflow answer, then send the request once more.

    Raises when nothing could be compacted, or when the retry overflows too: the turn
    ends `error` with a message that says so, and the next turn starts afresh.
    """
    if not await after_overflow(agent, turn, step, overflow):
        raise CodedError(
            f"the context is too long for the model and could not be compacted: {overflow}",
            overflow.code,
        )
    config, request = await prepare_request(agent, turn, step, system, agent.session.history())
    model = agent.runtime.models.get(config.provider)
    log_header(agent, request.header, False)
    agent.loop.requests_made += 1
    try:
        assembler, chunk_seqs = await stream_model(agent, turn, model.stream(request, step.signal))
    except CodedError as error:
        if error.code in OVERFLOW_CODES:
            raise CodedError(f"the context is still too long after compacting: {error}",
                             error.code) from error  # fmt: skip
        raise
    finish = assembler.finish
    if finish is not None and finish.code in OVERFLOW_CODES:
        raise CodedError(
            f"the context is still too long after compacting: {finish.message}", finish.code
        )
    return assembler, chunk_seqs


async def prepare_request(
    agent: Agent, turn: Turn, step: Step, system: str, history: MessageView
) -> tuple[c.ModelConfig, ModelRequest]:
    """`agent/request` on the model config, then the request it gives."""
    runtime = agent.runtime
    session = agent.session
    loop = agent.loop
    seed = (
        c.ModelConfig(provider=agent.resolved_provider, model=agent.resolved_model)
        if loop.requests_made == 0 or session.request_header is None
        else session.request_header.config
    )
    config = await runtime.seams.waterfall(
        S.REQUEST,
        agent.agent_id,
        lambda: S.Request(agent, turn.number, turn.step, step.signal, seed),
        seed,
    )
    if not config.provider or not config.model:
        raise CodedError(
            f'agent "{agent.agent_id}" has no provider/model: provider="{config.provider}", '
            f'model="{config.model}"; set them in the agent options or from agent/request',
            "NO_MODEL",
        )
    tools = runtime.tools
    order = runtime.tool_order
    prefix = tuple(loop.session_prefix or ())
    # Tuples: a later change in place to the order or the prefix is a change here too.
    inputs = (system, tools.version, agent.enabled_tools, order and tuple(order), prefix)
    header = loop.header
    if header is None or loop.header_inputs != inputs or header.config != config:
        header = c.RequestHeader(
            config=config,
            system=system,
            tools=tools.schemas(agent.agent_id, agent.enabled_tools, order),
            message_prefix=prefix,
        )
        loop.header, loop.header_inputs = header, inputs
    request = ModelRequest(
        agent_id=agent.agent_id,
        session_id=session.session_id,
        turn=turn.number,
        step=turn.step,
        header=header,
        messages=history.behind(header.message_prefix),
        options=agent.options,
    )
    return config, request


async def stream_model(
    agent: Agent, turn: Turn, chunks: AsyncIterator[st.StreamChunk]
) -> tuple[MessageAssembler, list[int]]:
    """Append each chunk as it streams, folding it into the message; the chunks' seqs."""
    limits = agent.runtime.limits
    assembler = MessageAssembler()
    chunk_seqs: list[int] = []
    # Per chunk, the bounds are compared here and their checks called only to raise.
    last_seq = turn.start_seq + limits.max_events_per_turn
    try:
        async for chunk in chunks:
            turn.scope.checkpoint()
            seq = agent.session.add_chunk(turn.number, turn.step, chunk).seq
            chunk_seqs.append(seq)
            if seq > last_seq:
                check_turn_events(limits, seq - turn.start_seq)
            assembler.add(chunk)
            if assembler.output_bytes > limits.max_content_bytes:
                check_model_output(limits, assembler.output_bytes)
            if due():
                await yield_if_due()
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            with turn.scope.shielded():  # its clean-up is not cut short
                await close()  # stop the provider's stream at once on abort
    turn.scope.checkpoint()
    return assembler, chunk_seqs


async def commit_message(
    agent: Agent,
    turn: Turn,
    step: Step,
    assembler: MessageAssembler,
    provenance: c.Provenance,
    chunk_seqs: list[int],
    max_tokens: bool,
) -> list[c.ToolCallBlock]:
    """`step/result` on the assembled message, then `assistant/message`; the calls to run."""
    runtime = agent.runtime
    assembled = assembler.content
    if max_tokens:
        assembled = without_tool_calls(assembled)
    content = assembled
    if runtime.seams.has(S.STEP_RESULT, agent.agent_id):  # else no message to build
        message = c.Message(role=c.ROLE_ASSISTANT, content=assembled, provenance=provenance)
        try:
            result = await runtime.seams.waterfall(
                S.STEP_RESULT,
                agent.agent_id,
                lambda: S.StepResult(agent, turn.number, turn.step, step.signal, message),
                message,
            )
        except (Exception, asyncio.CancelledError) as error:
            if isinstance(error, Exception) or turn.scope.cancel_called:
                append_assistant(agent, turn, [], provenance, assembler.usage, chunk_seqs)
            raise
        content = list(result.content)  # a listener may have edited `message` in place
        if max_tokens:
            content = without_tool_calls(content)
        if result is not message and list(result.content) != list(message.content):
            provenance.replay_state = ""  # replay state only fits the content it came with
    calls = [] if max_tokens else tool_calls_of(content)
    if len(calls) > runtime.limits.max_tool_calls_per_step:
        # The calls are left out of the log: no call stays there without its result.
        content = without_tool_calls(content)
        append_assistant(agent, turn, content, provenance, assembler.usage, chunk_seqs)
        check_tool_calls(runtime.limits, len(calls))
    append_assistant(agent, turn, content, provenance, assembler.usage, chunk_seqs)
    return calls


async def run_tools(agent: Agent, turn: Turn, step: Step, calls: list[c.ToolCallBlock]) -> None:
    """Run one tool batch; deferred contexts are appended after its results, even on abort."""
    session = agent.session
    runtime = agent.runtime
    tools = ToolPipeline(
        runtime.tools,
        runtime.seams,
        agent.agent_id,
        agent.enabled_tools,
        agent.approvals,
        agent.options.approval_required_tools,
    )
    batch = ToolBatch(
        tools,
        agent.agent_id,
        turn.number,
        turn.step,
        step.signal,
        agent.max_parallel_tool_calls,
        StepToolLog(agent, turn, step),
        agent.tasks.start,
        before_dispatch=session.settle,
        progress=ProgressReports(agent, turn.number, turn.step),
    )
    step.tool_batch_active = True
    try:
        with turn.scope.shielded():  # a cancel reaches the batch through the step's signal
            await run_tool_batch(calls, batch)
    finally:
        step.tool_batch_active = False
        deferred, step.deferred = step.deferred, []
        for message, consumes in deferred:
            session.add(message, consumes=consumes)


class StepToolLog:
    """A step's tool batch, recorded in the session: calls, results, held-back contexts."""

    def __init__(self, agent: Agent, turn: Turn, step: Step) -> None:
        self.agent = agent
        self.turn = turn
        self.step = step

    def call(self, call: c.ToolCallBlock) -> int:
        """Append `tool/call`; its seq."""
        fields = {"turn": self.turn.number, "step": self.turn.step, "call_id": call.id}
        fields.update(name=call.name, arguments=call.arguments)
        return self.agent.session.add_fields("tool_call", fields).seq

    def result(
        self, exec: ToolExecution, outcome: ToolOutcome, call_seq: int, ran: Ran | None
    ) -> None:
        """Append `tool/result` (bounded), then tell the committed-result observers."""
        agent = self.agent
        # Set in place: handed to the constructor, the content and times cost about
        # twice as much.
        # The model's call id, whatever a listener did to the content.
        result = ev.ToolResult(turn=self.turn.number, step=self.turn.step, call_id=exec.call_id)
        result.content.extend(outcome.content)
        if outcome.is_error:
            result.is_error = True
        if outcome.error is not None:
            result.error.CopyFrom(outcome.error)
        if ran is not None:  # its own duration: the commit waits for earlier calls
            start, end = result.start_time, result.end_time
            start.seconds, start.nanos = divmod(ran.start_ns, 10**9)
            end.seconds, end.nanos = divmod(ran.end_ns, 10**9)
        oversized = oversized_result(agent.runtime.limits, result.ByteSize())
        if oversized:  # one event must fit any client, and the model's context
            del result.content[:]
            result.content.append(text_block(oversized))
            result.is_error = True
            result.error.CopyFrom(ev.ToolError(name="ResultTooLarge", code=CONTENT_BYTES))
        if outcome.meta is not None:
            result.meta.CopyFrom(to_struct(outcome.meta))
        agent.session.add(result, source_event_seqs=[call_seq])
        seams = agent.runtime.seams
        name = exec.name  # plugins see stored results (of the tools they name)
        if seams.has(S.TOOLS_RESULT_COMMITTED, agent.agent_id, name):
            agent.session.after_commit(
                lambda: seams.emit(
                    S.TOOLS_RESULT_COMMITTED, agent.agent_id, S.ToolCallResult(exec, outcome), name
                )
            )

    def context(self, context: d.HookContext) -> None:
        """Hold a result's context back until the batch's results are in."""
        self.step.deferred.append((context_message(context), ()))


def log_header(agent: Agent, header: c.RequestHeader, first_request: bool) -> None:
    """Append `request/header` when this request owes one (first of instance, or changed)."""
    session = agent.session
    loop = agent.loop
    logged = session.request_header
    if first_request:
        reason = ev.HEADER_REASON_INITIAL if logged is None else ev.HEADER_REASON_RESUME
    elif logged is None:
        reason = ev.HEADER_REASON_CHANGE
    elif loop.header_logged is not None and (
        loop.header_logged[0] is header and loop.header_logged[1] is logged
    ):
        return  # the very header found equal to the very one logged: no comparison
    elif logged == header:
        loop.header_logged = (header, logged)
        return
    else:
        reason = ev.HEADER_REASON_CHANGE
    session.add(ev.RequestHeaderLogged(header=header, reason=reason))
    logged = session.request_header
    loop.header_logged = (header, logged) if logged is not None else None


def append_assistant(
    agent: Agent,
    turn: Turn,
    content: list[c.ContentBlock],
    provenance: c.Provenance,
    usage: c.Usage | None,
    chunk_seqs: list[int],
) -> None:
    """Append the step's `assistant/message` (empty content is a completion anchor)."""
    fields: dict[str, Any] = {"turn": turn.number, "step": turn.step, "content": content}
    fields.update(provenance=provenance, usage=usage)
    agent.session.add_fields("assistant_message", fields, source_event_seqs=chunk_seqs)


def copy_message(message: c.Message) -> c.Message:
    """A detached copy, so that a listener's later mutation cannot reach the cache."""
    copy = c.Message()
    copy.CopyFrom(message)
    return copy
