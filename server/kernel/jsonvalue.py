"""Lossless JSON: the only data the session log accepts in free-form fields."""

from __future__ import annotations

import math

from google.protobuf import struct_pb2


def check_lossless(value: object, what: str = "value") -> None:
    """Raise `TypeError` unless `value` survives a JSON round trip unchanged.

    Accepted: None, bool, int, finite float (not -0.0), str, lists, and dicts with
    string keys. Everything else (NaN, infinities, sets, bytes, objects) is refused.
    """
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, bool | int | str):
            continue
        if isinstance(item, float):
            if not math.isfinite(item) or (item == 0.0 and math.copysign(1.0, item) < 0):
                raise TypeError(f"{what} must be losslessly JSON-serializable ({item!r})")
            continue
        if isinstance(item, list):
            stack.extend(item)
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise TypeError(f"{what} must be losslessly JSON-serializable (key {key!r})")
                stack.append(child)
            continue
        raise TypeError(f"{what} must be losslessly JSON-serializable ({type(item).__name__})")


def to_struct(value: dict[str, object]) -> struct_pb2.Struct:
    """A checked dict as a protobuf Struct."""
    check_lossless(value)
    struct = struct_pb2.Struct()
    struct.update(value)  # type: ignore[arg-type]  # checked above
    return struct
