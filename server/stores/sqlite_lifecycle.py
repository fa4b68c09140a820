"""The SQL of data's end in the SQLite store: deleting a session, dropping old records."""

from __future__ import annotations

import sqlite3
import time

from server.kernel.errors import SessionNotFound
from server.stores import Answer
from server.stores.sqlite_sql import INSERT_REQUEST, transaction


def delete_session(db: sqlite3.Connection, session_id: str, answer: Answer | None) -> int:
    """Remove the session's rows in one transaction; the number of events removed.

    The request records written with the session go too; `answer` (the delete's own
    record, if any) is stored under no session, so that it outlives the session.
    """
    with transaction(db):
        found = db.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,))
        if found.fetchone() is None:
            raise SessionNotFound(session_id)
        row = db.execute(
            "SELECT COALESCE(SUM(count), 0) FROM events WHERE session_id = ?", (session_id,)
        ).fetchone()
        count = int(row[0])
        for table in ("events", "inbox", "requests", "sessions"):
            db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
        if answer is not None:
            record = answer(count)
            db.execute(
                INSERT_REQUEST,
                (record.agent_id, record.request_id, record.method, record.response, "",
                 time.time_ns()),
            )  # fmt: skip
    return count


def drop_requests(db: sqlite3.Connection, before_ns: int, limit: int) -> int:
    """Remove up to `limit` request records stored before `before_ns`; how many."""
    with transaction(db):
        return db.execute(
            "DELETE FROM requests WHERE (agent_id, request_id) IN"
            " (SELECT agent_id, request_id FROM requests WHERE stored_ns < ? LIMIT ?)",
            (before_ns, limit),
        ).rowcount


def vacuum_some(db: sqlite3.Connection, pages: int) -> bool:
    """Return up to `pages` free pages to the file system; whether more are free."""
    db.execute(f"PRAGMA incremental_vacuum({int(pages)})")
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    mode = db.execute("PRAGMA auto_vacuum").fetchone()[0]
    return bool(free) and mode == 2  # 2: incremental
