"""Hypothesis strategies for any protobuf message, built from its descriptor.

Values lean towards what reaches deep into the server (the ids of the live agent and its
session, small numbers) and towards known hostile values (type extremes, NaN, Unicode
digits, huge digit strings, template braces, out-of-range ports), with random ones mixed in.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

AGENT_ID = "fz"
"""The agent the fuzz server keeps alive, so that calls get past the lookup."""
SESSION_ID = "fz-session"
"""Its session."""

HOSTILE_STRINGS: dict[str, list[str]] = {
    "id": ["", AGENT_ID, SESSION_ID, "x" * 129, "a/b", "é"],
    "page_token": ["", "²", "9" * 4301, "12", "-1", "0x1"],
    "address": [
        "127.0.0.1:99999", "127.0.0.1:1", "localhost:0", "tls://127.0.0.1:1", "127.x.example:80",
        "[::1]:1", "::1:80", "192.0.2.1:80", "127.0.0.1:²",
    ],
    "persona": ["{{" * 20_000, "{{cwd}}", "{{model}}", "{{" * 20_000 + "}}", "{{nope}}"],
    "": ["", "\x00", "é" * 100, "/tmp", "scripted", "echo", "word_count", "{{cwd}}", "²"],
}  # fmt: skip
"""Strings that once made the server misbehave, or that name things it knows, by the
field name they suit ("" for any other string field)."""


def hostile(field: FieldDescriptor) -> list[str]:
    """The hostile strings for `field`, chosen by its name."""
    for suffix in ("page_token", "address", "persona", "id"):
        if field.name == suffix or field.name.endswith(f"_{suffix}"):
            return HOSTILE_STRINGS[suffix]
    return HOSTILE_STRINGS[""]


INT_RANGES: dict[int, tuple[int, int]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}

MAX_DEPTH = 4
"""Nested messages deeper than this are left empty (Struct and Value recurse forever)."""


def integers(low: int, high: int) -> st.SearchStrategy[int]:
    """Small values, the type's extremes and their neighbours, and anything in range."""
    edges = [v for v in (low, low + 1, high - 1, high, -1, 0, 1) if low <= v <= high]
    return st.one_of(
        st.integers(max(low, -2), min(high, 3)), st.sampled_from(edges), st.integers(low, high)
    )


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """The values of one non-message field."""
    kind = field.type
    if kind in INT_RANGES:
        return integers(*INT_RANGES[kind])
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        # Mostly the hostile ones: random text rarely gets past the first check.
        return st.one_of(
            st.sampled_from(hostile(field)), st.sampled_from(hostile(field)), st.text(max_size=12)
        )
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=16)
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if kind == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        known = [v.number for v in field.enum_type.values]
        return st.sampled_from([*known, max(known) + 1, -1])
    raise AssertionError(f"no strategy for field type {kind} of {field.full_name}")


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of `descriptor`: each field present or not, repeated ones 0-3 times."""

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message: Any = GetMessageClass(descriptor)()
        if depth >= MAX_DEPTH:
            return message  # type: ignore[no-any-return]
        for field in descriptor.fields:
            if not draw(st.booleans()):
                continue
            target = getattr(message, field.name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                key_field, value_field = field.message_type.fields
                keys = draw(st.lists(scalar(key_field), max_size=3, unique=True))
                for key in keys:
                    if value_field.message_type is not None:
                        value = draw(messages(value_field.message_type, depth + 1))
                        target[key].CopyFrom(value)
                    else:
                        target[key] = draw(scalar(value_field))
            elif field.is_repeated:
                if field.message_type is not None:
                    for item in draw(st.lists(messages(field.message_type, depth + 1), max_size=3)):
                        target.add().CopyFrom(item)
                else:
                    target.extend(draw(st.lists(scalar(field), max_size=3)))
            elif field.message_type is not None:
                target.CopyFrom(draw(messages(field.message_type, depth + 1)))
            else:
                setattr(message, field.name, draw(scalar(field)))
        return message  # type: ignore[no-any-return]

    return build()
