"""A plugin model's call is framed from the agent's kept message bytes: the bytes must be
those of the call serialized with its messages, whatever the history did in between."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf import struct_pb2

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.kernel.content import text_content
from server.plugins.model import EncodedMessages
from server.plugins.wire import call_request, message_entry, model_stream_request
from server.sessions.session import SessionLog


def header(prefix: Sequence[c.Message]) -> c.RequestHeader:
    schema = struct_pb2.Struct()
    # One key per object: two copies of a Struct need not list several keys in one order.
    schema.update({"properties": {"text": {"type": "string"}}})
    return c.RequestHeader(
        config=c.ModelConfig(provider="p", model="m", temperature=0.25, max_tokens=7),
        system="You are a test.",
        tools=[c.ToolSchema(name="word_count", description="counts", input_schema=schema)],
        message_prefix=prefix,
    )


def hook_call(
    head: c.RequestHeader, trace: bool, messages: Sequence[c.Message] = ()
) -> hk.HookCall:
    call = hk.HookCall(
        call_id="m1",
        kind=hk.CALL_KIND_MODEL_STREAM,
        agent_id="a",
        session_id="s",
        turn=3,
        step=2,
        model_stream=hk.ModelStreamCall(provider="p", header=head, messages=messages),
    )
    call.timeout.FromNanoseconds(2_500_000_000)
    if trace:
        call.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        call.tracestate = "k=v"
    return call


def spliced_and_whole(
    head: c.RequestHeader, trace: bool, messages: Sequence[c.Message], kept: EncodedMessages
) -> tuple[bytes, bytes]:
    entries = kept.entries(messages)
    spliced = model_stream_request(hook_call(head, trace), entries)
    return spliced, call_request(hook_call(head, trace, messages).SerializeToString())


PAYLOADS: list[object] = [
    ev.UserMessage(content=text_content("plain")),
    ev.AssistantMessage(
        content=[
            c.ContentBlock(reasoning=c.ReasoningBlock(text="hmm")),
            *text_content("ünïcödé ✓ 🎉"),
            c.ContentBlock(tool_call=c.ToolCallBlock(id="k1", name="word_count", arguments="")),
        ],
        provenance=c.Provenance(provider="p", model="m", replay_state="opaque"),
    ),
    ev.ToolResult(call_id="k1", content=text_content("x" * 6000), is_error=True),
    ev.ContextMessage(content=text_content("a context"), source=c.Source(kind="hook")),
    ev.SteeringMessage(content=text_content("steer"), source=c.Source(kind="user")),
]


def test_each_call_of_a_growing_history_is_the_serialized_call() -> None:
    kept = EncodedMessages()
    log = SessionLog("s", session_pb2.SessionHeader())
    prefixes = [[], [c.Message(role=c.ROLE_USER, content=text_content("P"))]]
    for round in range(3):  # lengths of one, two and three varint bytes
        for payload in PAYLOADS:
            log.add(payload)  # type: ignore[arg-type]
            for prefix in prefixes:
                for trace in (False, True):
                    head = header(prefix)
                    messages = log.history().behind(head.message_prefix)
                    spliced, whole = spliced_and_whole(head, trace, messages, kept)
                    assert spliced == whole, (round, payload, prefix, trace)
    assert len(whole) > 2**14


def test_a_replaced_history_an_older_view_and_a_plain_list_are_encoded_afresh() -> None:
    kept = EncodedMessages()
    log = SessionLog("s", session_pb2.SessionHeader())
    for payload in PAYLOADS:
        log.add(payload)  # type: ignore[arg-type]
    head = header([])
    older = log.history()
    log.add(ev.UserMessage(content=text_content("one more")))
    newer = log.history()
    compacted = ev.SessionEvent(
        seq=log.count, user_message=ev.UserMessage(content=text_content("summary"))
    )
    compacted.surface_op.CopyFrom(ev.SurfaceOp(kind=ev.SURFACE_OP_KIND_REPLACE, start=0, end=3))
    log.projection.apply(compacted)  # a stored compaction, as a resume replays it
    replaced = log.history()
    for messages in (newer, older, replaced, list(newer), newer, replaced):
        spliced, whole = spliced_and_whole(head, True, messages, kept)
        assert spliced == whole
        assert b"".join(kept.entries(messages)) == b"".join(message_entry(m) for m in messages)
    assert hk.ModelStreamCall.FromString(b"".join(kept.entries(replaced))).messages[0] == c.Message(
        role=c.ROLE_USER, content=text_content("summary")
    )
