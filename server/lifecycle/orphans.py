"""A sub-agent is never taken over: when its replica dies, it is disposed, not resumed.

Children live on their owner's server, in its memory (`lineage.py`). A replica that
takes the agents of a dead one over resumes the top-level agents; a child (its session
header names a parent) is retired instead: its crash tail is closed `interrupted`
under a claim and its lease is given up, as a single server's restart leaves it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from server.observability.logs import fields

if TYPE_CHECKING:
    from server.lifecycle.factory import AgentFactory

log = logging.getLogger(__name__)


async def retire_child(factory: AgentFactory, agent_id: str, session_id: str) -> bool:
    """Retire an orphaned sub-agent instead of resuming it; False for a top-level agent."""
    store = factory.runtime.store
    summary = await store.summary(session_id)
    if not summary.header.parent_agent_id:
        return False
    fence = await store.claim(session_id)
    await factory.catalogue.load(session_id, fence=fence)  # closes the crash's open turn
    await factory.ownership.release(agent_id)
    log.info(
        "agent %s: a sub-agent of %s, disposed with its owner's replica, not taken over",
        agent_id, summary.header.parent_agent_id,
        extra=fields(agent=agent_id, session=session_id),
    )  # fmt: skip
    return True
