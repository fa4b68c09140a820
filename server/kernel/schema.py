"""The schema primitives every configuration dataclass shares, the kernel's `Limits` too.

Declared below the settings package so that a kernel object validated from the config
file (`server/kernel/limits.py`) needs nothing above the kernel; the rest of the field
types are in `server/settings/fields.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, NoReturn, TypeVar

from pydantic import AfterValidator, ConfigDict, Strict
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

SCHEMA = ConfigDict(
    alias_generator=to_camel,
    extra="forbid",
    validate_by_name=True,
    validate_by_alias=True,
    use_attribute_docstrings=True,
)
"""The settings of every configuration dataclass: camelCase keys, nothing unknown."""


class ConfigError(ValueError):
    """The configuration is invalid; the message names the field."""


def fail(problem: str, path: str = "") -> NoReturn:
    """Refuse a value; `path` (relative to the value validated) names a nested field."""
    raise PydanticCustomError("config", "{problem}", {"problem": problem, "path": path})


T = TypeVar("T")


def rule(check: Callable[[T], str]) -> AfterValidator:
    """A validator from a function returning the problem of a value ("" when none)."""

    def validate(value: T) -> T:
        problem = check(value)
        if problem:
            fail(problem)
        return value

    return AfterValidator(validate)


PositiveInt = Annotated[
    int, Strict(), rule(lambda n: "" if n >= 1 else f"must be a positive integer, not {n!r}")
]
PositiveSeconds = Annotated[
    float, Strict(), rule(lambda s: "" if s > 0 else "must be a positive number")
]
