"""The PostgreSQL schema of the session store, as numbered migrations kept in the repo.

`agentloop_migrations` records the migrations applied. On open, the store applies the
missing ones in order, each in its own transaction, under an advisory lock so that
replicas starting together migrate once. A database migrated by a newer server (an
unknown number) is refused rather than guessed at.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "sessions, events, the durable inbox and request records",
        [
            """CREATE TABLE sessions (
                session_id text PRIMARY KEY,
                header bytea NOT NULL,
                create_ns bigint NOT NULL DEFAULT 0,
                driver text NOT NULL DEFAULT '',
                event_count bigint NOT NULL DEFAULT 0,
                turn_count integer NOT NULL DEFAULT 0,
                fence bigint NOT NULL DEFAULT 0,
                options bytea
            )""",
            """CREATE TABLE events (
                session_id text NOT NULL REFERENCES sessions ON DELETE CASCADE,
                seq bigint NOT NULL,
                kind integer NOT NULL,
                event bytea NOT NULL,
                PRIMARY KEY (session_id, seq)
            )""",
            """CREATE TABLE inbox (
                session_id text NOT NULL REFERENCES sessions ON DELETE CASCADE,
                entry_id bigint NOT NULL,
                kind text NOT NULL,
                message bytea NOT NULL,
                PRIMARY KEY (session_id, entry_id)
            )""",
            """CREATE TABLE requests (
                agent_id text NOT NULL,
                request_id text NOT NULL,
                method text NOT NULL,
                response bytea NOT NULL,
                PRIMARY KEY (agent_id, request_id)
            )""",
            "CREATE INDEX sessions_by_driver ON sessions (driver)",
        ],
    ),
    (
        2,
        "replicas and the leases by which one replica owns each live agent",
        [
            """CREATE TABLE replicas (
                replica_id text PRIMARY KEY,
                address text NOT NULL,
                heartbeat timestamptz NOT NULL DEFAULT now()
            )""",
            """CREATE TABLE leases (
                agent_id text PRIMARY KEY,
                session_id text NOT NULL UNIQUE,
                owner text NOT NULL,
                expires_at timestamptz NOT NULL,
                options bytea NOT NULL
            )""",
            "CREATE INDEX leases_by_owner ON leases (owner)",
            "CREATE INDEX leases_by_expiry ON leases (expires_at)",
        ],
    ),
    (
        3,
        "plugin registrations every replica connects to",
        [
            """CREATE TABLE plugins (
                name text PRIMARY KEY,
                request bytea NOT NULL
            )""",
        ],
    ),
    (
        4,
        "request records know their session (a delete takes them along) and their age",
        [
            "ALTER TABLE requests ADD COLUMN session_id text NOT NULL DEFAULT ''",
            "ALTER TABLE requests ADD COLUMN stored_at timestamptz NOT NULL DEFAULT now()",
            "CREATE INDEX requests_by_session ON requests (session_id)",
            "CREATE INDEX requests_by_age ON requests (stored_at)",
        ],
    ),
    (
        5,
        "sessions record when their agent was disposed (a retention rule reads it)",
        ["ALTER TABLE sessions ADD COLUMN disposed_ns bigint NOT NULL DEFAULT 0"],
    ),
]
"""(number, what it does, statements), in order; append, never edit a released one."""

MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS agentloop_migrations (
    number integer PRIMARY KEY,
    description text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""

LOCK_KEY = 0x6167656E746C6F6F  # "agentloo": the advisory lock of migrations
