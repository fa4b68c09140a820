"""The SQLite schema of the session store, and the migrations from older formats.

The `meta` table records the format version. A newer server migrates an older file
in place, in one transaction, on first open; a file of an unknown (newer) version is
refused as damaged rather than guessed at.
"""

from __future__ import annotations

import sqlite3

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.kernel.errors import SessionDamaged

FORMAT_VERSION = "7"
"""The on-disk format this code reads and writes."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    header BLOB NOT NULL,
    create_ns INTEGER NOT NULL DEFAULT 0,
    driver TEXT NOT NULL DEFAULT '',
    fence INTEGER NOT NULL DEFAULT 0,
    options BLOB,
    disposed_ns INTEGER NOT NULL DEFAULT 0,
    event_count INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    event BLOB NOT NULL,
    count INTEGER NOT NULL DEFAULT 1,
    kinds INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox (
    session_id TEXT NOT NULL,
    entry_id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    message BLOB NOT NULL,
    PRIMARY KEY (session_id, entry_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS requests (
    agent_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    method TEXT NOT NULL,
    response BLOB NOT NULL,
    session_id TEXT NOT NULL DEFAULT '',
    stored_ns INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, request_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_driver ON sessions (driver);
CREATE INDEX IF NOT EXISTS requests_by_session ON requests (session_id);
CREATE INDEX IF NOT EXISTS requests_by_age ON requests (stored_ns);
"""


def statements() -> list[str]:
    """The schema as single statements."""
    return [part.strip() for part in SCHEMA.split(";") if part.strip()]


def migrate(db: sqlite3.Connection, version: str, where: str) -> None:
    """Bring a file of an older format to `FORMAT_VERSION`, in one transaction."""
    if version not in ("1", "2", "3", "4", "5", "6"):
        raise SessionDamaged("", f"{where}: format version {version}, this server reads 1 to 7")
    db.execute("BEGIN IMMEDIATE")
    try:
        if version == "1":
            _from_1(db)
        if version in ("1", "2"):
            _from_2(db)
        if version in ("1", "2", "3"):
            _from_3(db)
        if version in ("1", "2", "3", "4"):
            _from_4(db)
        if version != "6":
            _from_5(db)
        _from_6(db)
        db.execute("UPDATE meta SET value = ? WHERE key = 'format_version'", (FORMAT_VERSION,))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _from_1(db: sqlite3.Connection) -> None:
    """Format 1 had no kind column, no inbox, no request records, no driver.

    Its `event_count` and `turn_count` columns stay: format 2 read both from the
    events, and format 7 counts events in `event_count` again (`_from_6` sets it).
    """
    db.execute("ALTER TABLE sessions ADD COLUMN create_ns INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE sessions ADD COLUMN driver TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE events RENAME TO events_v1")
    for statement in statements():  # not executescript: it would commit midway
        db.execute(statement)
    headers = db.execute("SELECT session_id, header FROM sessions").fetchall()
    for session_id, blob in headers:
        try:
            create_ns = session_pb2.SessionHeader.FromString(blob).create_time.ToNanoseconds()
        except Exception:  # a damaged header stays damaged: the load reports it
            create_ns = 0
        db.execute(
            "UPDATE sessions SET create_ns = ? WHERE session_id = ?", (create_ns, session_id)
        )
    payload = ev.SessionEvent.DESCRIPTOR.oneofs_by_name["payload"]
    numbers = {f.name: f.number for f in payload.fields}
    rows = db.execute("SELECT session_id, seq, event FROM events_v1").fetchall()
    converted = []
    for session_id, seq, blob in rows:
        try:
            kind = ev.SessionEvent.FromString(blob).WhichOneof("payload") or ""
        except Exception:  # a damaged row stays damaged: the load reports it
            kind = ""
        converted.append((session_id, seq, numbers.get(kind, 0), blob))
    db.executemany(
        "INSERT INTO events (session_id, seq, kind, event) VALUES (?, ?, ?, ?)", converted
    )
    db.execute("DROP TABLE events_v1")


def _from_2(db: sqlite3.Connection) -> None:
    """Format 2 numbered events from 0 and kept no agent options (nor, early, a fence).

    Every event moves one up, in its row and inside its bytes (its own `seq` and the
    `source_event_seqs` it cites), so that seqs start at 1. A row that does not decode
    keeps its bytes: the load reports it.
    """
    columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
    if "options" not in columns:
        db.execute("ALTER TABLE sessions ADD COLUMN options BLOB")
    if "fence" not in columns:
        db.execute("ALTER TABLE sessions ADD COLUMN fence INTEGER NOT NULL DEFAULT 0")
    rows = db.execute("SELECT session_id, seq, kind, event FROM events").fetchall()
    moved = []
    for session_id, seq, kind, blob in rows:
        try:
            event = ev.SessionEvent.FromString(blob)
        except Exception:
            moved.append((session_id, seq + 1, kind, blob))
            continue
        event.seq = seq + 1
        sources = [s + 1 for s in event.source_event_seqs]
        del event.source_event_seqs[:]
        event.source_event_seqs.extend(sources)
        moved.append((session_id, seq + 1, kind, event.SerializeToString()))
    db.execute("DELETE FROM events")
    db.executemany("INSERT INTO events (session_id, seq, kind, event) VALUES (?, ?, ?, ?)", moved)


def _from_3(db: sqlite3.Connection) -> None:
    """Format 3 stored one event per row; format 4 a commit's run of them (`sqlite_batches`).

    Each stored row is a run of one: it keeps its bytes and gains `count` 1 and the
    `kinds` bit of its kind.
    """
    columns = {row[1] for row in db.execute("PRAGMA table_info(events)")}
    if "count" not in columns:
        db.execute("ALTER TABLE events ADD COLUMN count INTEGER NOT NULL DEFAULT 1")
    if "kinds" not in columns:
        db.execute("ALTER TABLE events ADD COLUMN kinds INTEGER NOT NULL DEFAULT 0")
    db.execute("UPDATE events SET kinds = 1 << kind WHERE kind BETWEEN 0 AND 63")


def _from_4(db: sqlite3.Connection) -> None:
    """Format 4 kept request records with no session and no age (so, forever).

    Format 5 records the session a record was written with (a delete takes it along)
    and when (retention drops it after the retry window). Older records keep
    session '' and age 0: the first retention sweep drops them.
    """
    columns = {row[1] for row in db.execute("PRAGMA table_info(requests)")}
    if "session_id" not in columns:
        db.execute("ALTER TABLE requests ADD COLUMN session_id TEXT NOT NULL DEFAULT ''")
    if "stored_ns" not in columns:
        db.execute("ALTER TABLE requests ADD COLUMN stored_ns INTEGER NOT NULL DEFAULT 0")
    db.execute("CREATE INDEX IF NOT EXISTS requests_by_session ON requests (session_id)")
    db.execute("CREATE INDEX IF NOT EXISTS requests_by_age ON requests (stored_ns)")


def _from_5(db: sqlite3.Connection) -> None:
    """Format 5 did not record when a session's agent was disposed.

    Format 6 does (`disposed_ns`, for the retention rule on disposed agents' sessions).
    A session disposed before the migration reads 0: never disposed, so that rule
    leaves it to the idle one.
    """
    columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
    if "disposed_ns" not in columns:
        db.execute("ALTER TABLE sessions ADD COLUMN disposed_ns INTEGER NOT NULL DEFAULT 0")


def _from_6(db: sqlite3.Connection) -> None:
    """Format 6 read a session's event count from its events; format 7 also stores it.

    With the count kept beside the log, a log whose last rows went missing is told
    apart from one a crash cut short (`check_count`). Each session's count is its last
    stored seq (a file of format 1 has the column already, from before format 2).
    """
    columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
    if "event_count" not in columns:
        db.execute("ALTER TABLE sessions ADD COLUMN event_count INTEGER NOT NULL DEFAULT 0")
    db.execute(
        "UPDATE sessions SET event_count = COALESCE((SELECT seq + count - 1 FROM events"
        " WHERE events.session_id = sessions.session_id ORDER BY seq DESC LIMIT 1), 0)"
    )
