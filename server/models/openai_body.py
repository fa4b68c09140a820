"""The bytes of a Chat Completions request, the history's part of them kept between requests.

`request_bytes` is `json.dumps(request_body(...)).encode()`, byte for byte, but the
history's messages are translated and encoded once per agent (`ChatHistory`), not at
every request: a request costs what is new since the last one, plus joining bytes.
Why the kept bytes are never stale: `server.models.appended`. The adapter makes its
requests with `request_bytes_in_slices`: the same bytes, but a long backlog (an agent's
first request after a resume, a compaction or a restart: its whole history) is encoded
a slice at a time, the event loop running other agents between two.

The body is assembled as `json.dumps` writes it (default separators, ASCII): a list is
`[` + its items' JSON joined by `", "` + `]`, an item's JSON is the same alone as inside
the list, and the keys keep their order (`model`, `messages`, then `body_settings`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from agentloop.v1 import content_pb2 as c
from server.kernel.abort import AbortSignal
from server.models import ModelRequest
from server.models.appended import Appended, in_slices, slice_end, split
from server.models.openai_wire import JSON, ChatFold, body_settings, system_message

SEPARATOR = b", "
"""Between two items of a JSON list, as `json.dumps` writes it."""


def encoded(items: list[JSON]) -> bytes:
    """The items' JSON joined by `", "`, as `json.dumps` writes them inside a list."""
    return json.dumps(items).encode()[1:-1]  # one call for them all: `[` and `]` cut


class ChatHistory:
    """One agent's history as Chat Completions messages: their JSON, joined by `", "`.

    It holds the JSON of what the history messages sent so far added to the array, and
    the fold's state after them (the calls not answered yet): their stand-in answers
    close each request but are not kept, as the next message may answer those calls.
    """

    __slots__ = ("_appended", "_json", "_fold")

    def __init__(self) -> None:
        self._appended = Appended()
        self._json = bytearray()
        self._fold = ChatFold()

    @property
    def kept(self) -> int:
        """How many history messages it holds the JSON of (grows a slice at a time)."""
        return self._appended.count

    def messages(self, system: str, request: ModelRequest) -> list[bytes | bytearray]:
        """The JSON of the request's `messages` items, in runs to join with `", "`.

        The system prompt and the prefix are translated afresh (they may change between
        requests); the history's kept JSON is extended by the messages new since.
        """
        prefix, items, length = split(request.messages)
        head, key = _head(system, prefix)
        self._extend(items, length, key)
        return self._runs(head)

    async def messages_in_slices(
        self, system: str, request: ModelRequest, signal: AbortSignal
    ) -> list[bytes | bytearray]:
        """`messages`, the new history messages encoded a slice at a time (`in_slices`).

        Raises:
            Aborted: When `signal` fires between two slices (a cancel of the task stops
                it there too); what was kept is exact, the next request goes on from it.
        """
        prefix, items, length = split(request.messages)
        head, key = _head(system, prefix)

        def extend(start: int) -> int:
            end = slice_end(items, start, length)
            self._extend(items, end, key)
            return end

        await in_slices(self._appended, items, length, key, extend, signal)
        self._extend(items, length, key)  # nothing left, but after another's request
        return self._runs(head)

    def _extend(self, items: list[c.Message], length: int, key: tuple[str, ...]) -> None:
        """Keep the JSON of the first `length` messages of `items` (extended, or afresh)."""
        restart, new = self._appended.advance(items, length, key)
        if restart:
            self._json = bytearray()
            self._fold = ChatFold(key)
        kept = self._json
        added = [item for message in new for item in self._fold.add(message)]
        if added:
            if kept:
                kept += SEPARATOR
            kept += encoded(added)

    def _runs(self, head: list[JSON]) -> list[bytes | bytearray]:
        tail = ChatFold(self._fold.unanswered).answer_the_rest()  # the kept state stays
        return [run for run in (encoded(head), self._json, encoded(tail)) if run]


def _head(system: str, prefix: Sequence[c.Message]) -> tuple[list[JSON], tuple[str, ...]]:
    """The system prompt's and the prefix's items, and the calls the prefix left unanswered.

    Those calls shape the history's translation: they are the kept encoding's key.
    """
    head = [system_message(system)] if system else []
    fold = ChatFold()
    for message in prefix:
        head.extend(fold.add(message))
    return head, tuple(fold.unanswered)


def request_bytes(
    request: ModelRequest, model: str, max_tokens_field: str, history: ChatHistory
) -> bytes:
    """`json.dumps(request_body(request, model, max_tokens_field)).encode()`, from `history`.

    Args:
        request: The model call.
        model: The model name to send.
        max_tokens_field: One of `MAX_TOKENS_FIELDS`.
        history: The calling agent's kept history (extended here).
    """
    runs = history.messages(request.header.system, request)
    return _body(request, model, max_tokens_field, runs)


async def request_bytes_in_slices(
    request: ModelRequest,
    model: str,
    max_tokens_field: str,
    history: ChatHistory,
    signal: AbortSignal,
) -> bytes:
    """`request_bytes`, the history's new messages encoded a slice at a time.

    The same bytes; a long backlog (a first request) lets the event loop run other
    tasks between its slices (`server.models.appended.in_slices`).
    """
    runs = await history.messages_in_slices(request.header.system, request, signal)
    return _body(request, model, max_tokens_field, runs)


def _body(
    request: ModelRequest, model: str, max_tokens_field: str, runs: list[bytes | bytearray]
) -> bytes:
    """The body around the `messages` items' runs (joined by `", "`)."""
    opening = json.dumps({"model": model}).encode()[:-1]  # `{"model": "..."`
    settings = json.dumps(body_settings(request, model, max_tokens_field)).encode()
    parts: list[bytes | bytearray] = [opening, b', "messages": [']
    for run in runs:
        if len(parts) > 2:
            parts.append(SEPARATOR)
        parts.append(run)
    parts += (b"], ", settings[1:])  # `"stream": true, ...}`
    return b"".join(parts)  # the kept history is copied once, into the body
