"""Events set in place are the events the constructor builds, field for field."""

from __future__ import annotations

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from agentloop.v1 import stream_pb2 as st
from server.sessions.projection import project
from server.sessions.session import SessionLog


def without_time(event: ev.SessionEvent) -> ev.SessionEvent:
    copy = ev.SessionEvent()
    copy.CopyFrom(event)
    copy.ClearField("create_time")
    return copy


def test_a_chunk_set_in_place_is_the_event_of_its_fields() -> None:
    log = SessionLog("s", session_pb2.SessionHeader())
    chunk = st.StreamChunk(block_delta=st.BlockDelta(index=2, text="héllo"))
    fast = log.add_chunk(3, 1, chunk)
    slow = log.add_fields("assistant_chunk", {"turn": 3, "step": 1, "chunk": chunk})
    assert fast.create_time.seconds > 0
    assert (fast.seq, slow.seq) == (1, 2)
    fast.seq = slow.seq
    assert without_time(fast) == without_time(slow)
    chunk.block_delta.text = "changed"  # a copy: the caller's chunk is not the logged one
    assert fast.assistant_chunk.chunk.block_delta.text == "héllo"


def test_a_payload_and_its_surface_fields_set_in_place_match_the_constructor() -> None:
    log = SessionLog("s", session_pb2.SessionHeader())
    result = ev.ToolResult(turn=1, step=1, call_id="c1", content=[c.ContentBlock(
        text=c.TextBlock(text="7 words"))], is_error=True)  # fmt: skip
    event = log.add(result, source_event_seqs=[4, 5])
    expected = ev.SessionEvent(
        seq=event.seq,
        tool_result=result,
        surface_op=ev.SurfaceOp(kind=ev.SURFACE_OP_KIND_APPEND),
        source_event_seqs=[4, 5],
    )
    assert without_time(event) == expected
    end = log.add(ev.TurnEnd(turn=1, reason=ev.TurnEndReason(completed=ev.TurnCompleted())))
    assert not end.HasField("surface_op") and end.WhichOneof("payload") == "turn_end"
    assert end.turn_end.reason.HasField("completed")


def test_projected_messages_carry_every_part_of_their_events() -> None:
    call = c.ToolCallBlock(id="t", name="n", arguments="{}")
    content = [c.ContentBlock(text=c.TextBlock(text="hi")), c.ContentBlock(tool_call=call)]
    provenance = c.Provenance(provider="p", model="m", replay_state="r")
    assistant = ev.SessionEvent(
        assistant_message=ev.AssistantMessage(content=content, provenance=provenance)
    )
    assert project(assistant, "assistant_message") == c.Message(
        role=c.ROLE_ASSISTANT, content=content, provenance=provenance
    )
    result = ev.SessionEvent(
        tool_result=ev.ToolResult(call_id="t", content=content[:1], is_error=True)
    )
    block = c.ToolResultBlock(tool_call_id="t", content=content[:1], is_error=True)
    assert project(result, "tool_result") == c.Message(
        role=c.ROLE_USER, content=[c.ContentBlock(tool_result=block)]
    )
    user = ev.SessionEvent(user_message=ev.UserMessage(content=content[:1]))
    assert project(user, "user_message") == c.Message(role=c.ROLE_USER, content=content[:1])
    anchor = ev.SessionEvent(assistant_message=ev.AssistantMessage(provenance=provenance))
    assert project(anchor, "assistant_message") is None
