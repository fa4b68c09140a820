"""Opaque keyset page tokens.

A token is the URL-safe base64 of a small protobuf (a `Struct`): the method it was
issued by, the last key of its page, and the request's other parameters. The next page
starts after that key, so entries created or removed between pages neither shift nor
repeat the listing, as offsets would. A token of another method, or presented with
other parameters, is INVALID_ARGUMENT: the parameters are fixed across pages (the page
size may change). The format is the server's own and may change with it.
"""

from __future__ import annotations

import base64
import binascii

from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from server.kernel.errors import InvalidArgument

MAX_TOKEN_CHARS = 2048
"""Longer tokens were never issued (keys are ids of at most 128 characters)."""

NOT_ISSUED = "is not a token this server issued"


def issue(method: str, last_key: str, params: str = "") -> str:
    """The token of the page after the one that ended with `last_key`."""
    token = struct_pb2.Struct()
    token.update({"m": method, "k": last_key, "p": params})
    return base64.urlsafe_b64encode(token.SerializeToString(deterministic=True)).decode("ascii")


def last_key(page_token: str, method: str, params: str = "") -> str | None:
    """The last key of the previous page; None for the first page (no token)."""
    if not page_token:
        return None
    if len(page_token) > MAX_TOKEN_CHARS or not page_token.isascii():
        raise InvalidArgument("page_token", NOT_ISSUED)
    try:
        raw = base64.urlsafe_b64decode(page_token.encode("ascii"))
        token = struct_pb2.Struct.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        raise InvalidArgument("page_token", NOT_ISSUED) from None
    fields = token.fields
    if set(fields) != {"m", "k", "p"} or any(
        fields[name].WhichOneof("kind") != "string_value" for name in fields
    ):
        raise InvalidArgument("page_token", NOT_ISSUED)
    if fields["m"].string_value != method:
        raise InvalidArgument("page_token", f"{NOT_ISSUED} for {method}")
    if fields["p"].string_value != params:
        raise InvalidArgument(
            "page_token",
            f"was issued for other parameters ({fields['p'].string_value});"
            " keep them fixed across pages",
        )
    return fields["k"].string_value


def check_page_size(page_size: int, default: int, maximum: int) -> int:
    """The validated page size (0 means `default`)."""
    if page_size > maximum:
        raise InvalidArgument("page_size", f"must be at most {maximum}")
    if page_size < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return page_size or default
