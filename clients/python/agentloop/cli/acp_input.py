"""The editor's input to `agentloop acp`, checked line by line before the ACP SDK reads it.

The SDK skips a line that is not JSON without a word, and a JSON line that is not an
object stops its read loop. Here such lines get the JSON-RPC error the spec names
(`-32700 Parse error`, `-32600 Invalid request`) on stdout, and the bridge reads on;
well-formed lines pass through unchanged.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
MAX_DETAIL = 200
"""Characters of a bad line quoted back in the error."""


def problem(line: bytes) -> dict[str, Any] | None:
    """The JSON-RPC error answering a malformed line; None when the line is well formed."""
    try:
        message = json.loads(line)
    except ValueError as error:  # UnicodeDecodeError is a ValueError too
        return error_reply(None, PARSE_ERROR, "Parse error", f"not JSON: {error}")
    if not isinstance(message, dict):
        return error_reply(None, INVALID_REQUEST, "Invalid request", "not a JSON object")
    request_id = message.get("id")
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        request_id = None
    if "method" in message:
        if not isinstance(message["method"], str):
            return error_reply(
                request_id, INVALID_REQUEST, "Invalid request", "method: not a string"
            )
        return None
    if request_id is None:
        return error_reply(None, INVALID_REQUEST, "Invalid request", "neither a method nor an id")
    if "result" not in message and "error" not in message:
        return error_reply(
            request_id, INVALID_REQUEST, "Invalid request", "no method, result or error"
        )
    return None


def error_reply(
    request_id: str | int | None, code: int, message: str, details: str
) -> dict[str, Any]:
    """A JSON-RPC error response."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": code, "message": message, "data": {"details": details[:MAX_DETAIL]}},
    }


def checked(source: asyncio.StreamReader, replies: asyncio.StreamWriter) -> asyncio.StreamReader:
    """A reader of `source`'s well-formed lines; malformed ones are answered on `replies`."""
    passed = asyncio.StreamReader(limit=2**31 - 1)  # `source` already bounds a line

    async def pump() -> None:
        reply: dict[str, Any] | None
        while True:
            try:
                line = await source.readline()
            except ValueError:  # over the limit: asyncio has dropped the line
                line, reply = (
                    b" ",
                    error_reply(None, INVALID_REQUEST, "Invalid request", "line too long"),
                )
            else:
                if not line:
                    break
                reply = problem(line) if line.strip() else None
            if reply is not None:
                replies.write(json.dumps(reply).encode() + b"\n")
                await replies.drain()
            elif line.strip():
                passed.feed_data(line if line.endswith(b"\n") else line + b"\n")
        passed.feed_eof()

    task = asyncio.get_running_loop().create_task(pump())
    _PUMPS.add(task)
    task.add_done_callback(_PUMPS.discard)
    return passed


_PUMPS: set[asyncio.Task[None]] = set()
"""The running pumps (a task needs a reference until it is done)."""
