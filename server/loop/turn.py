"""How a turn records steering and closes its step and itself.

Its state is `server.loop.running.Turn`; its end reason is decided in
`server/loop/ending.py`.
"""

from __future__ import annotations

from agentloop.v1 import session_event_pb2 as ev
from server.loop.agent import Agent
from server.loop.ending import fail, final_reason
from server.loop.running import Turn


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


def close_step(agent: Agent, turn: Turn) -> None:
    """Append `step/end` if a step is open (retried once if vetoed)."""
    if not turn.step_open:
        return
    end = {"turn": turn.number, "step": turn.step}
    try:
        agent.session.add_fields("step_end", end)
    except Exception as error:
        fail(agent, turn, error)
        agent.session.add_fields("step_end", end)
    turn.step_open = False


def close_turn(agent: Agent, turn: Turn) -> None:
    """Append the one `turn/end` (retried once if vetoed, keeping the first error)."""
    try:
        agent.session.add(ev.TurnEnd(turn=turn.number, reason=final_reason(turn)))
    except Exception as error:
        fail(agent, turn, error)
        agent.session.add(ev.TurnEnd(turn=turn.number, reason=turn.reason))
