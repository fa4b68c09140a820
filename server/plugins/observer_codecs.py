"""The codecs of the observer seams: what a plugin is notified of, field by field.

Observers run for every event (chunks included), so each fill is one copy into the
notification, built only once the subscription's filter and its buffer let it go.
"""

from __future__ import annotations

from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.kernel import seams as S
from server.plugins.calls import invocation, tool_output
from server.plugins.conditions import Facets
from server.plugins.modes import Codec, Watch


def _fill_session_event(input: S.SessionEventSeen, call: hk.HookCall) -> None:
    call.session_event.event.CopyFrom(input.event)  # one copy, not one per nesting level


def _session_event_kind(input: S.SessionEventSeen) -> str | None:
    return input.event.WhichOneof("payload")


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
    Watch(S.SESSION_COMMITTED, _fill_session_event, Facets(event_kind=_session_event_kind)),
    Watch(S.AGENT_EVENT, _fill_agent_event, Facets(event_kind=_agent_event_kind)),
    Watch(S.TOOLS_RESULT_COMMITTED, _fill_tool_result, Facets(tool=_tool_result_name)),
)
"""The codecs of the seams a plugin observes."""
