"""The field types of the server configuration, and how their errors read.

The configuration is declared as pydantic dataclasses (`server/settings/config.py`): each field
once, with its type, its default and its doc. YAML keys are the camelCase spelling of
the field names; unknown keys are errors. Every error becomes a `ConfigError` whose
message starts with the path of the field, as a user wrote it: `agents[0].tools: ...`.

The primitives the kernel's `Limits` shares (`SCHEMA`, `PositiveInt`, `rule`, `fail`,
`ConfigError`) live in `server/kernel/schema.py`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Union

from pydantic import AfterValidator, BeforeValidator, Strict, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from server.kernel.schema import ConfigError, fail, rule


def one_of(*choices: str) -> AfterValidator:
    """The value is one of `choices`: "'x' must be a, b or c"."""
    shown = ", ".join(c for c in choices[:-1] if c) + f" or {choices[-1]}"
    return rule(lambda value: "" if value in choices else f"{value!r} must be {shown}")


Text = Annotated[str, Strict()]
Flag = Annotated[bool, Strict()]
Integer = Annotated[int, Strict()]
Seconds = Annotated[float, Strict()]
NonNegativeSeconds = Annotated[
    float, Strict(), rule(lambda s: "" if s >= 0 else "must be a non-negative number")
]


def host_port_problem(value: str) -> str:
    """`host:port`, with a port number."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        return f"{value!r} must be host:port"
    return ""


HostPort = Annotated[str, Strict(), rule(host_port_problem)]
OptionalHostPort = Annotated[str, Strict(), rule(lambda v: v and host_port_problem(v))]
"""`host:port`, or empty for none (an endpoint that is off unless given an address)."""


def number_as_text(value: object) -> object:
    """A bare port written as a YAML number reads as text."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


PortText = Annotated[str, BeforeValidator(number_as_text), Strict()]


def sorted_pairs(value: object) -> object:
    """A mapping of strings, as sorted (key, value) pairs (already pairs: kept)."""
    if isinstance(value, tuple) and all(
        isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        for pair in value
    ):
        return value  # validated again (a config rebuilt with `replace`)
    if not isinstance(value, dict):
        fail("must be a mapping")
    for key, item in value.items():
        if not isinstance(item, str):
            fail("must be a string", f".{key}")
    return tuple(sorted(value.items()))


Pairs = Annotated[tuple[tuple[str, str], ...], BeforeValidator(sorted_pairs)]

PROBLEMS = {
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "dataclass_type": "must be a mapping",
    "missing_argument": "is required",
    "missing": "is required",
}
"""What a pydantic error type means, in the words of this project's messages."""


def config_error(
    error: ValidationError, root: type[Any], hidden: tuple[str, ...] = ()
) -> ConfigError:
    """The first problem of `error` as a `ConfigError` naming its field.

    `hidden`: keys of `root` not to list among the known ones.
    """
    detail = error.errors()[0]
    where = path_of(detail["loc"])
    context = detail.get("ctx") or {}
    if detail["type"] == "config":
        problem, nested = str(context["problem"]), str(context["path"])
        if nested:
            where = f"{where}{nested}" if nested[0] in ".[" or not where else f"{where}.{nested}"
    elif detail["type"] == "unexpected_keyword_argument":
        keys = keys_of(owner_of(root, detail["loc"][:-1]))
        known = ", ".join(sorted(key for key in keys if key not in hidden))
        problem = f"unknown field (known: {known})"
    else:
        problem = PROBLEMS.get(detail["type"], detail_message(detail))
    return ConfigError(f"{where or 'config'}: {problem}")


def detail_message(detail: ErrorDetails) -> str:
    """Pydantic's own message, for an error type without a wording here."""
    return detail["msg"][0].lower() + detail["msg"][1:]


def path_of(loc: tuple[int | str, ...]) -> str:
    """`("agents", 0, "tools")` -> `agents[0].tools`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def keys_of(cls: type[Any]) -> dict[str, str]:
    """The keys a configuration dataclass accepts, to its field names."""
    if cls is type(None):
        return {}
    found: dict[str, Any] = getattr(cls, "__pydantic_fields__", {})
    return {info.alias or to_camel(name): name for name, info in found.items()}


def owner_of(root: type[Any], loc: tuple[int | str, ...]) -> type[Any]:
    """The dataclass at `loc` (camelCase keys and list indexes) below `root`."""
    cls = root
    for part in loc:
        if isinstance(part, int):
            continue
        hints = typing.get_type_hints(cls, include_extras=True)
        cls = dataclass_in(hints[keys_of(cls).get(part, part)])
    return cls


def dataclass_in(hint: Any) -> type[Any]:
    """The dataclass a field's type holds: itself, its items, or its non-None option."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    origin = typing.get_origin(hint)
    if origin in (tuple, list, Union, types.UnionType, Annotated):
        for arg in typing.get_args(hint):
            if arg is not Ellipsis and arg is not type(None):
                found = dataclass_in(arg)
                if found is not type(None):
                    return found
    return type(None)
