"""The bytes of a Chat Completions request, the history's part of them kept between requests.

`request_bytes` is `json.dumps(request_body(...)).encode()`, byte for byte, but the
history's messages are translated and encoded once per agent (`ChatHistory`), not at
every request: a request costs what is new since the last one, plus joining bytes.
Why the kept bytes are never stale: `server.models.appended`.

The body is assembled as `json.dumps` writes it (default separators, ASCII): a list is
`[` + its items' JSON joined by `", "` + `]`, an item's JSON is the same alone as inside
the list, and the keys keep their order (`model`, `messages`, then `body_settings`).
"""

from __future__ import annotations

import json

from server.models import ModelRequest
from server.models.appended import Appended, split
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

    def messages(self, system: str, request: ModelRequest) -> list[bytes | bytearray]:
        """The JSON of the request's `messages` items, in runs to join with `", "`.

        The system prompt and the prefix are translated afresh (they may change between
        requests); the history's kept JSON is extended by the messages new since.
        """
        prefix, items, length = split(request.messages)
        head = [system_message(system)] if system else []
        fold = ChatFold()
        for message in prefix:
            head.extend(fold.add(message))
        # The prefix's unanswered calls shape the history's translation: they are the key.
        restart, new = self._appended.advance(items, length, tuple(fold.unanswered))
        if restart:
            self._json = bytearray()
            self._fold = fold
        kept = self._json
        added = [item for message in new for item in self._fold.add(message)]
        if added:
            if kept:
                kept += SEPARATOR
            kept += encoded(added)
        tail = ChatFold(self._fold.unanswered).answer_the_rest()  # the kept state stays
        return [run for run in (encoded(head), kept, encoded(tail)) if run]


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
    opening = json.dumps({"model": model}).encode()[:-1]  # `{"model": "..."`
    settings = json.dumps(body_settings(request, model, max_tokens_field)).encode()
    parts: list[bytes | bytearray] = [opening, b', "messages": [']
    for run in history.messages(request.header.system, request):
        if len(parts) > 2:
            parts.append(SEPARATOR)
        parts.append(run)
    parts += (b"], ", settings[1:])  # `"stream": true, ...}`
    return b"".join(parts)  # the kept history is copied once, into the body
