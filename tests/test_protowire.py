"""The wire-format primitives agree with protobuf's own encoding."""

from __future__ import annotations

from agentloop.plugin.transport import field_key, framed, varint
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import session_event_pb2 as se


def test_varint_matches_protobufs_encoding_across_byte_boundaries() -> None:
    assert varint(0) == b"\x00"  # (a zero field is not serialized at all)
    for value in (1, 0x7F, 0x80, 300, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 2**35, 2**63 - 1):
        encoded = se.SessionEvent(seq=value).SerializeToString()
        assert encoded == b"\x08" + varint(value), value  # field 1, varint type


def test_a_framed_field_is_the_message_protobuf_serializes() -> None:
    call = hk.HookCall(call_id="c-1", agent_id="a", turn=3).SerializeToString()
    for payload in (call, call * 100):  # a one-byte and a two-byte length
        request = framed(field_key(hk.HandleRequest.CALL_FIELD_NUMBER), payload)
        assert hk.HandleRequest.FromString(request).call == hk.HookCall.FromString(payload)
    assert field_key(1) == b"\x0a" and field_key(16) == b"\x82\x01"
