"""Deleting a session: refused while an agent drives it, unless it is disposed first.

The delete itself is one transaction of the store (`SessionStore.delete`). Around it,
the session id is held like a live agent's (the factory's reserved ids), so that no
create or resume can take the id while its rows are being removed, and the readers'
copies of the session are dropped. A delete with a request id stores its answer in
the same transaction, scoped to the session id (`DELETE_SCOPE`): a retry gets the
first answer, not NOT_FOUND.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from server.kernel.errors import FailedPrecondition
from server.kernel.ids import check_id
from server.lifecycle.factory import AgentFactory
from server.observability.logs import fields
from server.stores import Answer, RequestRecord

log = logging.getLogger("agentloop.access")
"""Deletes are recorded beside the access log's line of the call: who asked is there."""

DELETE_SCOPE = "session/"
"""Request ids of deletes are scoped to `session/<session id>`: never an agent id (ids
have no '/'), so they cannot meet an agent's ids."""


@dataclass(frozen=True)
class Deleted:
    """What a delete removed."""

    session_id: str
    events: int
    disposed_agent_id: str = ""


Answering = Callable[["Deleted"], RequestRecord]
"""The request record of a delete's answer, made from what it removed."""


async def delete_session(
    factory: AgentFactory, session_id: str, *, dispose: bool, answer: Answering | None = None
) -> Deleted:
    """Delete a stored session; with `dispose`, dispose the live agent driving it first.

    Raises `InvalidArgument` (field `session_id`) for a malformed id, `FailedPrecondition`
    (`SESSION_IN_USE`) while an agent drives it here or on another replica, `NotFound`
    for an unknown session.
    """
    check_id("session_id", session_id)
    disposed = ""
    live = factory.sessions.get(session_id)
    if live is not None and live.agent_id:
        if not dispose:
            raise FailedPrecondition(
                f'session "{session_id}" is driven by live agent "{live.agent_id}": dispose it'
                " first (DisposeAgent), or set dispose_agent",
                "SESSION_IN_USE",
                session_id=session_id,
                agent_id=live.agent_id,
            )
        await factory.dispose(live.agent_id)
        disposed = live.agent_id
    reserved = factory.catalogue.reserved
    if session_id in reserved:  # checked and taken with no await between: one winner
        raise FailedPrecondition(
            f'session "{session_id}" is being taken by an agent; retry later',
            "SESSION_IN_USE",
            session_id=session_id,
        )
    reserved.add(session_id)
    try:
        if await factory.ownership.still_driven(session_id):
            raise FailedPrecondition(
                f'session "{session_id}" is driven by a live agent on another replica:'
                " dispose it first",
                "SESSION_IN_USE",
                session_id=session_id,
            )
        record: Answer | None = None
        if answer is not None:
            answering = answer  # bound here for the closure (mypy narrows no further)

            def record(events: int) -> RequestRecord:
                return answering(Deleted(session_id, events, disposed))

        events = await factory.runtime.store.delete(session_id, record)
    finally:
        reserved.discard(session_id)
    factory.catalogue.forget(session_id)
    log.info(
        "session deleted",
        extra=fields(session=session_id, events=events, disposed_agent=disposed),
    )
    return Deleted(session_id, events, disposed)
