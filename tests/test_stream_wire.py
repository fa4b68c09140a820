"""StreamSessionEvents responses as bytes: the same message as the one built from fields."""

from __future__ import annotations

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_service_pb2 as pb
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from server.edge.api_stream_wire import response_bytes, serialize


def test_response_bytes_parse_to_the_response_of_the_same_fields() -> None:
    big = c.ContentBlock(text=c.TextBlock(text="x" * 20_000))  # a multi-byte length
    events = [
        ev.SessionEvent(seq=1, turn_start=ev.TurnStart(turn=1)),
        ev.SessionEvent(seq=2, user_message=ev.UserMessage(content=[big])),
        ev.SessionEvent(seq=3),
    ]
    for size in (127, 128):  # the last length of one varint byte, the first of two
        text = ev.SessionEvent(seq=4, user_message=ev.UserMessage(content=[big]))
        text.user_message.content[0].text.text = "y" * (size - 10)
        assert text.ByteSize() == size
        events.append(text)
    live = [
        ae.AgentEvent(agent_id="a", status=ae.AgentStatusChanged(status=ae.AGENT_STATUS_RUNNING))
    ]
    long_id = ae.AgentEvent(agent_id="a" * 200)  # an agent event of a multi-byte length
    for kept, agent_events, dropped in [
        (events, live, 4),
        (events, [*live, long_id], 300),
        (events, [], 0),
        (events[:1], live, 0),
        ([], live, 0),
        ([], [], 7),
    ]:
        want = pb.StreamSessionEventsResponse(
            events=kept, agent_events=agent_events, dropped_agent_events=dropped
        )
        raw = response_bytes([e.SerializeToString() for e in kept], agent_events, dropped)
        assert pb.StreamSessionEventsResponse.FromString(raw) == want
        assert len(raw) == want.ByteSize()


def test_the_serializer_passes_bytes_through_and_serializes_messages() -> None:
    message = pb.StreamSessionEventsResponse(subscribed=True)
    assert serialize(b"\x18\x01") == b"\x18\x01"
    assert serialize(message) == message.SerializeToString()
