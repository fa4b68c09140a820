"""The codecs of the observer seams: what a plugin is notified of, field by field.

Observers run for every event (chunks included), so each fill is one copy into the
notification, built only once the subscription's filter and its buffer let it go; a
session event is not even copied: it is queued with the notification's fixed fields,
encoded once per agent, and written as bytes in one pass (`event_notes`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.plugin.conditions import event_kinds
from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.kernel import seams as S
from server.kernel.seams import SeamRegistry
from server.plugins.calls import invocation, tool_output
from server.plugins.conditions import Facets
from server.plugins.event_notes import event_head
from server.plugins.listeners import RemoteListener
from server.plugins.modes import Codec, Watch


def _fill_session_event(input: S.SessionEventSeen, call: hk.HookCall) -> None:
    call.session_event.event.CopyFrom(input.event)  # one copy, not one per nesting level


def _session_event_kind(input: S.SessionEventSeen) -> str | None:
    return input.event.WhichOneof("payload")


HEADS_KEPT = 1024
"""Agents whose notification head a subscription keeps (then it starts over)."""


@dataclass(frozen=True)
class WatchEvents(Watch[S.SessionEventSeen]):
    """`Watch` for session events: filtered, admitted, then queued encoded from its parts.

    The notification is the one `fill` makes, as `event_notes.event_entry` writes it.
    """

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener queues the event with its head when there is room."""
        # Bound once: this runs for every event, chunks included.
        offer, slot = remote.caller.offer_event, remote.slot
        seam, session_of = remote.subscription.seam, remote.session_of
        matches = remote.matcher(self.facets)
        skipped, counted = remote.skip_count
        heads: dict[str, tuple[str, bytes]] = {}
        """Per agent: its session and the head of its notifications."""
        last: list[Any] = [None, b""]
        """The agent of the latest notification (a weak reference) and its head: an
        agent's session is its own for life, so its next event needs no look-up."""

        def head_of(agent: S.SeamAgent) -> bytes:
            agent_id = agent.agent_id
            session_id = session_of(agent_id)
            kept = heads.get(agent_id)
            if kept is None or kept[0] != session_id:
                if len(heads) >= HEADS_KEPT:
                    heads.clear()
                kept = heads[agent_id] = (session_id, event_head(seam, agent_id, session_id))
            if session_id:  # live: kept for its next events
                with contextlib.suppress(TypeError):  # not weakly referable: looked up
                    last[:] = [weakref.ref(agent), kept[1]]
            return kept[1]

        def listener(input: S.SessionEventSeen) -> None:
            if matches is not None and not matches(input):
                skipped[counted] += 1
                return
            agent, latest = input.agent, last[0]
            head = last[1] if latest is not None and latest() is agent else head_of(agent)
            offer(head, input.event, slot)  # admitted, or dropped and counted

        def each(inputs: Sequence[S.SessionEventSeen]) -> None:
            # A run is one agent's (`emit_each` follows one agent's route): one head.
            if not inputs:
                return
            if isinstance(inputs, S.SessionEventRun):  # its events, no input built
                head = head_of(inputs.agent)
                if matches is None:
                    offer_all(head, inputs.events, slot)
                    return
                if kinds is not None:  # event kinds its only condition: read, no input
                    events = inputs.events
                    kept = [event for event in events if event.WhichOneof("payload") in kinds]
                    skipped[counted] += len(events) - len(kept)
                    offer_all(head, kept, slot)
                    return
            else:
                head = head_of(inputs[0].agent)
                if matches is None:
                    offer_all(head, [input.event for input in inputs], slot)
                    return
            events = []
            for input in inputs:
                if matches(input):
                    events.append(input.event)
                else:
                    skipped[counted] += 1
            offer_all(head, events, slot)

        offer_all = remote.caller.offer_events
        subscription = remote.subscription
        kinds = event_kinds(subscription)
        if subscription.agent_ids or subscription.conditions.agent_labels:
            kinds = None  # other conditions too: the matcher decides
        return remote.on(seams, self.key, listener, self.facets, each)


def _fill_agent_event(input: S.AgentEventSeen, call: hk.HookCall) -> None:
    call.agent_event.event.CopyFrom(input.event)


def _agent_event_kind(input: S.AgentEventSeen) -> str | None:
    return input.event.WhichOneof("event")


def _tool_result_name(input: S.ToolCallResult) -> str:
    return input.exec.name


def _fill_tool_result(input: S.ToolCallResult, call: hk.HookCall) -> None:
    payload = call.tool_result
    payload.invocation.CopyFrom(invocation(input.exec))
    payload.output.CopyFrom(tool_output(input.outcome))


OBSERVER_CODECS: tuple[Codec, ...] = (
    WatchEvents(S.SESSION_COMMITTED, _fill_session_event, Facets(event_kind=_session_event_kind)),
    Watch(S.AGENT_EVENT, _fill_agent_event, Facets(event_kind=_agent_event_kind)),
    Watch(S.TOOLS_RESULT_COMMITTED, _fill_tool_result, Facets(tool=_tool_result_name)),
)
"""The codecs of the seams a plugin observes."""
