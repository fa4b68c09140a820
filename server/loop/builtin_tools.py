"""A few harmless built-in tools that an agent can enable by name."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from server.kernel.tools import Tool, ToolArgumentsError, ToolExecution

MAX_SLEEP_SECONDS = 300

DELEGATION_TOOLS = ("delegate", "collect")
"""Built-in too, but bound to the agent factory (`server/lifecycle/delegation.py`)."""

_TEXT = {"type": "string", "description": "The text."}


def builtin_tools() -> list[Tool]:
    """The built-in tools; each is visible only to agents that enable it."""
    return [
        Tool(
            name="current_time",
            description="Returns the current time in UTC, as ISO-8601.",
            input_schema=_object_schema({}),
            execute=_current_time,
            parallel_safe=True,
        ),
        Tool(
            name="echo",
            description="Returns the given text unchanged.",
            input_schema=_object_schema({"text": _TEXT}),
            execute=_echo,
        ),
        Tool(
            name="sleep",
            description=f"Waits the given number of seconds (at most {MAX_SLEEP_SECONDS}).",
            input_schema=_object_schema(
                {
                    "seconds": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": MAX_SLEEP_SECONDS,
                        "description": "How long to wait, in seconds.",
                    }
                }
            ),
            execute=_sleep,
            parallel_safe=True,
        ),
        Tool(
            name="word_count",
            description="Counts the whitespace-separated words of the given text.",
            input_schema=_object_schema({"text": _TEXT}),
            execute=_word_count,
            parallel_safe=True,
        ),
    ]


def _object_schema(properties: dict[str, object]) -> dict[str, object]:
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


async def _current_time(exec: ToolExecution) -> str:
    _arguments(exec, [])
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _echo(exec: ToolExecution) -> str:
    return _text(exec)


async def _word_count(exec: ToolExecution) -> str:
    return f"{len(_text(exec).split())} words"


async def _sleep(exec: ToolExecution) -> str:
    seconds = _arguments(exec, ["seconds"])["seconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ToolArgumentsError(f'sleep: "seconds" must be a number, not {_json_type(seconds)}')
    if not 0 <= seconds <= MAX_SLEEP_SECONDS:
        raise ToolArgumentsError(f'sleep: "seconds" must be between 0 and {MAX_SLEEP_SECONDS}')
    # Checked first: `race` would refuse, leaving the sleep coroutine never awaited.
    exec.signal.raise_if_aborted()
    await exec.signal.race(asyncio.sleep(seconds))
    return f"slept {seconds:g} seconds"


def _text(exec: ToolExecution) -> str:
    text = _arguments(exec, ["text"])["text"]
    if not isinstance(text, str):
        raise ToolArgumentsError(f'{exec.name}: "text" must be a string, not {_json_type(text)}')
    return text


def _arguments(exec: ToolExecution, names: list[str]) -> dict[str, object]:
    """The arguments object, which must have exactly the properties `names`."""
    args = exec.arguments
    if isinstance(args, str) and args == exec.raw_arguments:
        raise ToolArgumentsError(f"{exec.name}: the arguments are not valid JSON")
    if not isinstance(args, dict):
        raise ToolArgumentsError(
            f"{exec.name}: the arguments must be a JSON object, not {_json_type(args)}"
        )
    for name in names:
        if name not in args:
            raise ToolArgumentsError(f'{exec.name}: "{name}" is required')
    for name in args:
        if name not in names:
            raise ToolArgumentsError(f'{exec.name}: unexpected argument "{name}"')
    return args


def _json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
