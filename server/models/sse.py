"""Decoding a `text/event-stream` (server-sent events) incrementally."""

from __future__ import annotations

import re
from dataclasses import dataclass

from server.kernel.errors import CodedError

MAX_EVENT_LINE = 16 * 1024 * 1024
"""The longest event-stream line buffered before the stream is refused."""

_EOL = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event of a `text/event-stream`."""

    event: str
    """The event type; "message" when the stream named none."""
    data: str
    """The data lines, joined with newlines."""


class EventStreamDecoder:
    """Decodes a `text/event-stream` incrementally (the WHATWG parsing rules).

    Lines end in CRLF, LF or CR; comment lines start with ":"; consecutive `data:` lines
    are joined with newlines; a blank line dispatches the event. `id` and `retry` are
    ignored (nothing reconnects here).
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""
        self._started = False

    def feed(self, data: bytes) -> list[ServerSentEvent]:
        """The events completed by `data`."""
        self._buffer += data
        if not self._started and self._buffer:
            self._started = True
            self._buffer = self._buffer.removeprefix(b"\xef\xbb\xbf")
        events: list[ServerSentEvent] = []
        start = 0
        for match in _EOL.finditer(self._buffer):
            if match.group() == b"\r" and match.end() == len(self._buffer):
                break  # maybe the first half of a CRLF split across reads
            event = self._line(self._buffer[start : match.start()])
            if event is not None:
                events.append(event)
            start = match.end()
        self._buffer = self._buffer[start:]
        if len(self._buffer) > MAX_EVENT_LINE:
            raise CodedError(
                f"an event-stream line longer than {MAX_EVENT_LINE} bytes", "BAD_CHUNK"
            )
        return events

    def close(self) -> list[ServerSentEvent]:
        """The events left at a clean end of the stream, even without a final blank line."""
        events = self.feed(b"\n") if self._buffer else []
        last = self._line(b"")
        return [*events, last] if last is not None else events

    def _line(self, raw: bytes) -> ServerSentEvent | None:
        line = raw.decode("utf-8", errors="replace")
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = ServerSentEvent(self._event or "message", "\n".join(self._data))
            self._data, self._event = [], ""
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None
