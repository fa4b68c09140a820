"""The payloads of session events, keyed by their message type.

A session event carries one payload of the `payload` oneof; each payload has its own
message type, so the type alone says which field it fills: code hands over a typed
payload (`session.record(ev.TurnStart(turn=3))`), never a field name as a string.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from agentloop.v1 import approval_pb2
from agentloop.v1 import session_event_pb2 as ev

Payload = (
    ev.TurnStart
    | ev.UserMessage
    | ev.PromptBlocked
    | ev.ContextMessage
    | ev.SteeringMessage
    | ev.StepStart
    | ev.RequestHeaderLogged
    | ev.AssistantChunk
    | ev.AssistantMessage
    | ev.ToolCall
    | ev.ToolResult
    | ev.StepEnd
    | ev.TurnEnd
    | ev.MessageDropped
    | approval_pb2.ApprovalRequested
    | approval_pb2.ApprovalResolved
)
"""Every payload a session event may carry."""


def _kinds() -> dict[type[Message], str]:
    oneof = ev.SessionEvent.DESCRIPTOR.oneofs_by_name["payload"]
    empty = ev.SessionEvent()
    return {type(getattr(empty, field.name)): field.name for field in oneof.fields}


PAYLOAD_KINDS: dict[type[Message], str] = _kinds()
"""Payload message type -> its field of `SessionEvent.payload` (from the descriptor)."""


def kind_of(payload: Payload) -> str:
    """The `payload` field a payload fills: `ev.TurnStart` -> "turn_start"."""
    return PAYLOAD_KINDS[type(payload)]


def event_of(payload: Payload, **fields: Any) -> ev.SessionEvent:
    """A session event carrying `payload`, with other fields (seq, create_time...)."""
    carried: dict[str, Any] = {kind_of(payload): payload}
    return ev.SessionEvent(**fields, **carried)
