"""The model requests of a stored log, rebuilt from its events alone.

At each `step/start` the request is the logged header (the latest `request/header`,
logged right after the step start when it changed) and the message prefix followed by
the history as of that step, derived afresh by a detached replay of the events before
it: new message objects, never those a provider saw (or kept an encoding of).
"""

from __future__ import annotations

from collections.abc import Sequence

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.models import ModelRequest
from server.sessions.session import SessionLog


def replayed_requests(events: Sequence[ev.SessionEvent]) -> list[ModelRequest]:
    """The request of each step of `events` (the whole stored log, in order)."""
    requests = []
    for i, event in enumerate(events):
        if not event.HasField("step_start"):
            continue
        logged = i + 1 < len(events) and events[i + 1].HasField("request_header")
        log = SessionLog("replay", session_pb2.SessionHeader(), seed=events[: i + 1 + logged])
        header = log.request_header
        assert header is not None, f"no request header before the request of seq {event.seq}"
        requests.append(
            ModelRequest(
                agent_id="replay",
                session_id="replay",
                turn=event.step_start.turn,
                step=event.step_start.step,
                header=header,
                messages=[*header.message_prefix, *log.derive_messages()],
                options=agent_pb2.AgentOptions(),
            )
        )
    return requests
