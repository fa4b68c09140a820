"""Session event payloads are dispatched by their message type."""

from __future__ import annotations

from typing import get_args

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.kernel.events import PAYLOAD_KINDS, Payload, event_of, kind_of
from server.sessions.session import SessionLog


def test_every_payload_of_the_oneof_has_its_type_in_the_union() -> None:
    fields = {f.name for f in ev.SessionEvent.DESCRIPTOR.oneofs_by_name["payload"].fields}
    assert set(PAYLOAD_KINDS.values()) == fields  # one distinct message type per field
    assert set(get_args(Payload)) == set(PAYLOAD_KINDS)


def test_a_payload_fills_the_field_of_its_type() -> None:
    assert kind_of(ev.TurnStart(turn=2)) == "turn_start"
    assert kind_of(ev.RequestHeaderLogged()) == "request_header"
    event = event_of(ev.StepEnd(turn=1, step=3), seq=7)
    assert (event.seq, event.WhichOneof("payload"), event.step_end.step) == (7, "step_end", 3)


def test_a_typed_add_appends_what_the_named_append_does() -> None:
    typed = SessionLog("typed", session_pb2.SessionHeader())
    named = SessionLog("named", session_pb2.SessionHeader())
    typed.add(ev.TurnStart(turn=1))
    named.add(ev.TurnStart(turn=1))
    assert [e.turn_start for e in typed.events] == [e.turn_start for e in named.events]
    assert typed.open_turn == named.open_turn == 1
