"""What the crash suite says when a check fails: the history of a call, the store's rows.

When an accepted message is missing, the assertion names, for each missing request
id: the calls made with it (method, cycle, outcome: a first call, or a retry after a
kill), what the store holds for it, read directly (its request record, any inbox row
that still holds it, any stored event that carries it, in any session), and the lines
of the server logs about its agent (leases, takeovers, stops, refusals).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from agentloop.v1 import session_event_pb2 as ev
from server.stores import decode_entry
from server.stores.sqlite_batches import unpack

LOG_WORDS = re.compile(
    r"lease|taking over|stopped|refused|pending message|disposed|failed|conflict|closing turn",
    re.IGNORECASE,
)
"""Server log lines worth showing next to a missing message of an agent they name."""


@dataclass
class CallHistory:
    """Every call made with one request id, in order: (cycle, method, outcome)."""

    agent_id: str
    calls: list[tuple[int, str, str]] = field(default_factory=list)

    def describe(self) -> str:
        return "; ".join(f"cycle {c}: {m} {o}" for c, m, o in self.calls)


@dataclass
class StoreRows:
    """The rows one query of the store returned (PostgreSQL or SQLite, same tables)."""

    requests: list[tuple[str, str, str]]
    """(agent id, request id, method)"""
    inbox: list[tuple[str, int, str, bytes]]
    """(session id, entry id, kind, message)"""
    events: list[tuple[str, int, bytes]]
    """(session id, seq, event)"""
    sessions: list[tuple[str, str, int]]
    """(session id, driver, fence)"""


async def read_store(sqlite_path: Path | None, dsn: str | None) -> StoreRows:
    """Every row that can carry a request id, read straight from the store."""
    queries = (
        "SELECT agent_id, request_id, method FROM requests",
        "SELECT session_id, entry_id, kind, message FROM inbox",
        "SELECT session_id, seq, event FROM events",
        "SELECT session_id, driver, fence FROM sessions",
    )
    if dsn is not None:
        conn = await asyncpg.connect(dsn)
        try:
            results = [[tuple(r) for r in await conn.fetch(q)] for q in queries]
        finally:
            await conn.close()
    else:
        assert sqlite_path is not None
        db = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
        try:
            results = [db.execute(q).fetchall() for q in queries[:2] + queries[3:]]
            rows = db.execute("SELECT session_id, seq, count, event FROM events").fetchall()
            events = [  # a row holds a run of events (`sqlite_batches`)
                (session_id, seq + offset, raw)
                for session_id, seq, count, blob in rows
                for offset, raw in enumerate(unpack(blob, count))
            ]
            results.insert(2, events)
        finally:
            db.close()
    return StoreRows(*results)


def request_id_of(event: ev.SessionEvent) -> str:
    """The request id an event carries, if its payload has one."""
    kind = event.WhichOneof("payload") or ""
    payload = getattr(event, kind, None)
    return str(getattr(payload, "request_id", "")) if payload is not None else ""


def store_facts(rows: StoreRows, agent_id: str, request_id: str) -> str:
    """What the store holds for one request id of one agent."""
    facts = []
    record = [m for a, r, m in rows.requests if a == agent_id and r == request_id]
    facts.append(f"request record: {record[0] if record else 'none'}")
    pending = []
    for session_id, entry_id, kind, blob in rows.inbox:
        entry = decode_entry(entry_id, kind, blob)
        if entry.message.request_id == request_id:
            pending.append(f"{session_id}#{entry_id} ({kind})")
    facts.append(f"pending in inbox: {pending or 'none'}")
    events = []
    for session_id, seq, blob in rows.events:
        event = ev.SessionEvent.FromString(blob)
        if request_id_of(event) == request_id:
            events.append(f"{session_id}@{seq} {event.WhichOneof('payload')}")
    facts.append(f"stored events: {events or 'none'}")
    driven = [f"{s} (fence {f})" for s, d, f in rows.sessions if d == agent_id]
    facts.append(f"sessions driven by {agent_id}: {driven}")
    return "; ".join(facts)


def log_lines(tmp_path: Path, agent_id: str, limit: int = 40) -> list[str]:
    """The last lines of the server logs that name `agent_id` and say something of note."""
    named = re.compile(rf"(?<![\w-]){re.escape(agent_id)}(?![\w-])")
    lines: list[str] = []
    starts = sorted(tmp_path.glob("server-*.stderr"), key=lambda p: int(p.stem.split("-")[1]))
    for path in starts:
        lines.extend(
            f"{path.stem}: {line}"
            for line in path.read_text(errors="replace").splitlines()
            if named.search(line) and LOG_WORDS.search(line)
        )
    return lines[-limit:]


async def explain_missing(
    tmp_path: Path,
    sqlite_path: Path | None,
    dsn: str | None,
    agent_id: str,
    missing: set[str],
    histories: dict[str, CallHistory],
) -> str:
    """A report on accepted request ids that no stored event records."""
    try:
        rows: StoreRows | None = await read_store(sqlite_path, dsn)
    except Exception as error:  # the report must not hide the failure it explains
        rows = None
        unread = f"store not readable: {error!r}"
    parts = []
    for request_id in sorted(missing):
        history = histories.get(request_id)
        calls = history.describe() if history is not None else "no call history"
        facts = store_facts(rows, agent_id, request_id) if rows is not None else unread
        parts.append(f"\n  {request_id}: calls: {calls}\n    store: {facts}")
    logs = "\n    ".join(log_lines(tmp_path, agent_id)) or "(none)"
    return "".join(parts) + f"\n  server log lines about {agent_id}:\n    {logs}"
