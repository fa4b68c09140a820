"""When compaction runs: on a call (idle agent), before a request, after an overflow.

- Manual (`compact_idle`): only while no turn runs and nothing is queued; the summary
  node goes in a one-shot turn of its own, and the next turn waits until it is there.
- Threshold (`before_request`): before a step's request whose size would pass the
  window less the output reserve; at most one per request, between steps (never under
  a tool batch). A failure is reported live and the request goes ahead unchanged.
- Overflow (`after_overflow`): the provider said the context was too long: compact,
  then the step retries its request once.
"""

from __future__ import annotations

import asyncio
import logging

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.abort import NEVER
from server.kernel.errors import AgentDisposed, CodedError, FailedPrecondition, Unavailable
from server.loop.agent import Agent
from server.loop.compaction import Outcome, compact
from server.loop.context import used_tokens
from server.loop.running import Step, Turn

log = logging.getLogger(__name__)


async def compact_idle(
    agent: Agent, instructions: str, keep_tokens: int | None, request_id: str
) -> Outcome:
    """A manual compaction of an idle agent; refused while a turn runs or work is queued."""
    if agent.disposed:
        raise AgentDisposed(agent.agent_id)
    if agent.loop.compaction is not None:
        raise FailedPrecondition(f'agent "{agent.agent_id}" is already compacting')
    if agent.status == ae.AGENT_STATUS_RUNNING or agent.session.open_turn or agent.inbox.queued:
        raise FailedPrecondition(
            f'agent "{agent.agent_id}" is running a turn: compact it once it is idle'
            " (WaitIdle); a turn compacts itself when its context nears the window"
        )
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    agent.loop.compaction = done
    try:
        outcome = await compact(
            agent,
            ev.COMPACTION_TRIGGER_MANUAL,
            NEVER,
            instructions=instructions,
            keep_tokens=keep_tokens,
            request_id=request_id,
        )
    except CodedError as error:
        if agent.disposed:
            raise AgentDisposed(agent.agent_id) from error
        raise Unavailable(f'agent "{agent.agent_id}": the summary request failed: {error}',
                          "COMPACTION_FAILED", agent_id=agent.agent_id) from error  # fmt: skip
    finally:
        agent.loop.compaction = None
        done.set_result(None)
    return outcome


async def before_request(agent: Agent, turn: Turn, step: Step) -> None:
    """Compact first when the next request would pass the window less the reserve."""
    used, _ = used_tokens(agent.session)
    if used <= agent.context.compact_at:
        return
    try:
        await compact(agent, ev.COMPACTION_TRIGGER_THRESHOLD, step.signal, turn=turn.number)
    except CodedError as error:  # the request goes ahead; an overflow compacts again
        log.warning("agent %s: automatic compaction failed: %s", agent.agent_id, error)


async def after_overflow(agent: Agent, turn: Turn, step: Step, error: CodedError) -> bool:
    """Compact after the provider's overflow answer; whether the request may be retried."""
    # What overflowed was more than the window: keep at most a quarter of it verbatim.
    used, _ = used_tokens(agent.session)
    keep = min(agent.context.keep_recent, used // 4)
    try:
        outcome = await compact(agent, ev.COMPACTION_TRIGGER_OVERFLOW, step.signal,
                                keep_tokens=keep, turn=turn.number)  # fmt: skip
    except CodedError as failure:
        log.warning("agent %s: compaction after an overflow failed: %s", agent.agent_id, failure)
        return False
    return outcome.event is not None
