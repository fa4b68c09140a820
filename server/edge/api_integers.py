"""Integers a request may carry: every unsigned 64-bit field fits a signed 64-bit one.

The stores keep sequence numbers and counts as SQL `INTEGER`/`BIGINT` (signed 64
bits); a `uint64` past 2^63 - 1 (a `boundary_seq` of 2^64 - 1) would fail deep in a
store as an internal error. The request guard asks `too_large` of every decoded
request and refuses such a value with `INVALID_ARGUMENT` naming the field. Which
fields of a message type can hold one (nested messages included) is worked out once
per type, so a request without any costs a dictionary lookup.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

INT64_MAX = 2**63 - 1

UNSIGNED_64 = {FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64}

_plans: dict[str, list[Any]] = {}
"""Per message type, its fields that are (or lead to) unsigned 64-bit integers."""


def _plan(descriptor: Any, visiting: frozenset[str] = frozenset()) -> list[Any]:
    """The fields of `descriptor` worth a look (typed loosely: upb and Python differ)."""
    known = _plans.get(descriptor.full_name)
    if known is not None:
        return known
    fields = []
    for field in descriptor.fields:
        if field.type in UNSIGNED_64:
            fields.append(field)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            inner = field.message_type
            if inner.full_name in visiting or _plan(
                inner, visiting | {descriptor.full_name}
            ):  # recursive types: looked at once
                fields.append(field)
    if not visiting:
        _plans[descriptor.full_name] = fields
    return fields


def too_large(message: Message, prefix: str = "") -> str:
    """The path of the first unsigned 64-bit field past `INT64_MAX`, or ""."""
    for field in _plan(message.DESCRIPTOR):
        name = f"{prefix}{field.name}"
        value = getattr(message, field.name)
        if field.type in UNSIGNED_64:
            values = list(value) if field.is_repeated else [value]
            for index, number in enumerate(values):
                if number > INT64_MAX:
                    return f"{name}[{index}]" if field.is_repeated else name
        elif field.message_type.GetOptions().map_entry:
            for key, entry in value.items():
                if isinstance(entry, Message):
                    found = too_large(entry, f"{name}[{key}].")
                    if found:
                        return found
        elif field.is_repeated:
            for index, entry in enumerate(value):
                found = too_large(entry, f"{name}[{index}].")
                if found:
                    return found
        elif message.HasField(field.name):
            found = too_large(value, f"{name}.")
            if found:
                return found
    return ""
