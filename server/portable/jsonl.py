"""The portable session file: JSON lines of the protobuf JSON mapping, versioned.

Line 1 is the header: `{"format": "agentloop-sessions", "version": 2}`. Then, for
each session, one `{"session": {...}}` line (its id, header, stored agent options,
last driver and how many events, inbox entries and request records follow), its
events in sequence order, one `{"event": SessionEvent}` line each, then its pending
inbox entries, one `{"inbox": {"entry_id", "kind", "message"}}` line each, then the
request records written with it (the first answers of calls made with a
`request_id`, so that a retry after an import is still answered from them), one
`{"request": {"agent_id", "request_id", "method", "response", "stored_ns"}}` line
each (`response`: the answer's protobuf bytes in base64; `stored_ns`: when it was
stored, to the microsecond). A session whose agent was disposed (and none drove it
since) says when, `"disposed_ns"` on its session line (absent otherwise): the
retention rule on disposed agents' sessions reads it. The last line is
`{"end": {"sessions": N, "events": E}}`: a file cut short has none, and is refused.
Version 1 (no request records) is read too.

Messages use the protobuf JSON mapping with the proto's field names, keys sorted (a
map such as a `Struct` has no order of its own: sorted, an export of the same sessions
is the same file, byte for byte), so any language
with protobuf can read a file; the import parses each back and checks that it is
what its line says (events numbered 1..n with no gap, each with a payload). A reader
refuses a file of a newer version rather than guessing at it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import InvalidArgument
from server.kernel.ids import id_problem
from server.stores import INBOX_CONTEXT, INBOX_MESSAGE, INBOX_STEERING, InboxEntry, RequestRecord

FORMAT = "agentloop-sessions"
VERSION = 2
"""The version this code writes; it reads this one and the earlier ones, and refuses a later."""
READS = (1, 2)

M = TypeVar("M", bound=Message)

KINDS = (INBOX_MESSAGE, INBOX_STEERING, INBOX_CONTEXT)


class CorruptExport(InvalidArgument):
    """A session file that cannot be imported: names the line and what is wrong."""

    reason = "CORRUPT_EXPORT"

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}", problem)
        self.line = line


@dataclass
class PortableSession:
    """One session as the file carries it."""

    session_id: str
    header: session_pb2.SessionHeader
    options: agent_pb2.AgentOptions | None = None
    driver: str = ""
    events: list[ev.SessionEvent] = field(default_factory=list)
    inbox: list[InboxEntry] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    disposed_ns: int = 0
    """When its last driver was disposed (ns since the epoch); 0 when it was not."""


def _dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _line(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True) + "\n"


def header_line() -> str:
    """The first line of a file."""
    return _line({"format": FORMAT, "version": VERSION})


def session_lines(session: PortableSession) -> Iterator[str]:
    """The lines of one session: its description, its events, its inbox."""
    described: dict[str, Any] = {
        "id": session.session_id,
        "header": _dict(session.header),
        "driver": session.driver,
        "events": len(session.events),
        "inbox": len(session.inbox),
        "requests": len(session.requests),
    }
    if session.options is not None:
        described["options"] = _dict(session.options)
    if session.disposed_ns:
        described["disposed_ns"] = session.disposed_ns
    yield _line({"session": described})
    for event in session.events:
        yield _line({"event": _dict(event)})
    for entry in session.inbox:
        message = _dict(entry.message)
        yield _line({"inbox": {"entry_id": entry.entry_id, "kind": entry.kind, "message": message}})
    for record in session.requests:
        yield _line(
            {
                "request": {
                    "agent_id": record.agent_id,
                    "request_id": record.request_id,
                    "method": record.method,
                    "response": base64.b64encode(record.response).decode(),
                    "stored_ns": record.stored_ns,
                }
            }
        )


def end_line(sessions: int, events: int) -> str:
    """The last line of a file."""
    return _line({"end": {"sessions": sessions, "events": events}})


def read_sessions(lines: Iterable[str]) -> list[PortableSession]:
    """Every session of a file, checked whole; `CorruptExport` naming the first bad line."""
    reader = _Reader()
    number = 0
    for number, text in enumerate(lines, start=1):
        reader.take(number, text)
    return reader.finish(number)


def read_file(stream: IO[str]) -> list[PortableSession]:
    """`read_sessions` of an open text file."""
    return read_sessions(stream)


class _Reader:
    """The state of a file being read: where it is, and what is still due."""

    def __init__(self) -> None:
        self.sessions: list[PortableSession] = []
        self.ids: set[str] = set()
        self.current: PortableSession | None = None
        self.events_due = 0
        self.inbox_due = 0
        self.requests_due = 0
        self.version = 0
        self.started = False
        self.ended = False

    def take(self, number: int, text: str) -> None:
        if self.ended:
            raise CorruptExport(number, "comes after the end line")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise CorruptExport(number, f"is not JSON ({error.msg})") from None
        if not isinstance(value, dict) or len(value) != 1 and not self._is_header(value):
            raise CorruptExport(number, "must be a JSON object with one key")
        if not self.started:
            self._header(number, value)
            return
        [(kind, body)] = value.items()
        if not isinstance(body, dict):
            raise CorruptExport(number, f'"{kind}" must be a JSON object')
        if kind == "event":
            self._event(number, body)
        elif kind == "inbox":
            self._inbox(number, body)
        elif kind == "request" and self.version >= 2:
            self._request(number, body)
        elif kind == "session":
            self._session(number, body)
        elif kind == "end":
            self._end(number, body)
        else:
            raise CorruptExport(number, f'"{kind}" is not a line kind of version {self.version}')

    def finish(self, last: int) -> list[PortableSession]:
        if not self.started:
            raise CorruptExport(1, "the file is empty: no header line")
        if not self.ended:
            raise CorruptExport(last, "the file ends here without its end line (truncated?)")
        return self.sessions

    @staticmethod
    def _is_header(value: dict[str, Any]) -> bool:
        return "format" in value

    def _header(self, number: int, value: dict[str, Any]) -> None:
        if value.get("format") != FORMAT:
            raise CorruptExport(number, f'is not an agentloop session file (format "{FORMAT}")')
        version = value.get("version")
        if version not in READS or not isinstance(version, int):
            raise CorruptExport(
                number, f"format version {version!r}; this server reads 1 to {VERSION}"
            )
        self.version = version
        self.started = True

    def _close_session(self, number: int) -> None:
        if self.events_due or self.inbox_due or self.requests_due:
            raise CorruptExport(
                number,
                f'session "{self.current.session_id if self.current else ""}" is missing'
                f" {self.events_due} events, {self.inbox_due} inbox entries and"
                f" {self.requests_due} request records",
            )

    def _session(self, number: int, body: dict[str, Any]) -> None:
        self._close_session(number)
        session_id = body.get("id")
        if not isinstance(session_id, str) or id_problem(session_id):
            raise CorruptExport(number, f"session id {session_id!r} is not a well-formed id")
        if session_id in self.ids:
            raise CorruptExport(number, f'session "{session_id}" appears twice')
        counts = [body.get("events"), body.get("inbox"), body.get("requests", 0)]
        if not all(isinstance(n, int) and n >= 0 for n in counts):
            raise CorruptExport(number, "a session line needs counts of events and inbox")
        events, inbox, requests = (int(n or 0) for n in counts)
        if requests and self.version < 2:
            raise CorruptExport(number, "request records need format version 2")
        driver = body.get("driver", "")
        if not isinstance(driver, str):
            raise CorruptExport(number, "driver must be a string")
        disposed_ns = body.get("disposed_ns", 0)
        if not isinstance(disposed_ns, int) or isinstance(disposed_ns, bool) or disposed_ns < 0:
            raise CorruptExport(number, "disposed_ns must be a non-negative integer")
        header = _parse(number, body.get("header", {}), session_pb2.SessionHeader())
        options = None
        if "options" in body:
            options = _parse(number, body["options"], agent_pb2.AgentOptions())
        self.current = PortableSession(session_id, header, options, driver)
        self.current.disposed_ns = disposed_ns
        self.sessions.append(self.current)
        self.ids.add(session_id)
        self.events_due, self.inbox_due, self.requests_due = events, inbox, requests

    def _event(self, number: int, body: dict[str, Any]) -> None:
        session = self.current
        if session is None or not self.events_due:
            raise CorruptExport(number, "an event line where none is due")
        event = _parse(number, body, ev.SessionEvent())
        expected = len(session.events) + 1
        if event.seq != expected:
            raise CorruptExport(
                number, f'event {event.seq} of session "{session.session_id}" is not {expected}'
            )
        if event.WhichOneof("payload") is None:
            raise CorruptExport(number, f"event {event.seq} has no payload")
        session.events.append(event)
        self.events_due -= 1

    def _inbox(self, number: int, body: dict[str, Any]) -> None:
        session = self.current
        if session is None or self.events_due or not self.inbox_due:
            raise CorruptExport(number, "an inbox line where none is due")
        entry_id, kind = body.get("entry_id"), body.get("kind")
        if not isinstance(entry_id, int) or entry_id < 1:
            raise CorruptExport(number, "entry_id must be a positive integer")
        if any(e.entry_id >= entry_id for e in session.inbox[-1:]):
            raise CorruptExport(number, f"entry {entry_id} does not follow the previous one")
        if kind not in KINDS:
            raise CorruptExport(number, f"inbox kind {kind!r} is not one of {', '.join(KINDS)}")
        blank: ev.UserMessage | ev.ContextMessage = (
            ev.ContextMessage() if kind == INBOX_CONTEXT else ev.UserMessage()
        )
        message = _parse(number, body.get("message", {}), blank)
        session.inbox.append(InboxEntry(entry_id, kind, message))
        self.inbox_due -= 1

    def _request(self, number: int, body: dict[str, Any]) -> None:
        session = self.current
        if session is None or self.events_due or self.inbox_due or not self.requests_due:
            raise CorruptExport(number, "a request line where none is due")
        texts = [body.get(key) for key in ("agent_id", "request_id", "method", "response")]
        stored_ns = body.get("stored_ns")
        if not all(isinstance(text, str) and text for text in texts[:3]):
            raise CorruptExport(number, "a request record needs agent_id, request_id and method")
        if not isinstance(stored_ns, int) or stored_ns < 0:
            raise CorruptExport(number, "stored_ns must be a non-negative integer")
        try:
            response = base64.b64decode(str(texts[3]), validate=True)
        except (binascii.Error, ValueError):
            raise CorruptExport(number, "response must be base64") from None
        record = RequestRecord(str(texts[0]), str(texts[1]), str(texts[2]), response, stored_ns)
        if session.requests and (
            (record.agent_id, record.request_id)
            <= (session.requests[-1].agent_id, session.requests[-1].request_id)
        ):
            raise CorruptExport(number, "request records must be sorted, each once")
        session.requests.append(record)
        self.requests_due -= 1

    def _end(self, number: int, body: dict[str, Any]) -> None:
        self._close_session(number)
        events = sum(len(s.events) for s in self.sessions)
        if body.get("sessions") != len(self.sessions) or body.get("events") != events:
            raise CorruptExport(
                number,
                f"the end line counts {body.get('sessions')} sessions and {body.get('events')}"
                f" events; the file holds {len(self.sessions)} and {events}",
            )
        self.ended = True


def _parse(number: int, value: object, message: M) -> M:
    """`message` filled from its JSON mapping; `CorruptExport` naming the line if it is not."""
    if not isinstance(value, dict):
        raise CorruptExport(number, f"{message.DESCRIPTOR.name} must be a JSON object")
    try:
        json_format.ParseDict(value, message)
    except json_format.ParseError as error:
        raise CorruptExport(number, f"not a {message.DESCRIPTOR.name}: {error}") from None
    return message
