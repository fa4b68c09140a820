"""Ids: what a well-formed agent, session or plugin id is.

Checked by every layer that takes one from a caller (the catalogue, the factory, the
API, plugin descriptions), so it lives in the kernel.
"""

from __future__ import annotations

import re

from server.kernel.errors import InvalidArgument

ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""Agent, session and plugin ids."""


def id_problem(value: str) -> str:
    """Why `value` is not a well-formed id; "" when it is."""
    if not value:
        return "must not be empty"
    if not ID_PATTERN.fullmatch(value):
        return f"{value[:40]!r} must be 1-128 characters of letters, digits, '.', '_', ':', '-'"
    return ""


def check_id(field: str, value: str) -> None:
    """Raise `InvalidArgument` naming `field` unless `value` is a well-formed id."""
    problem = id_problem(value)
    if problem:
        raise InvalidArgument(field, problem)
