"""The PostgreSQL schema of the session store, as numbered migrations kept in the repo.

`agentloop_migrations` records the migrations applied. On open, the store applies the
missing ones in order, each in its own transaction, under an advisory lock so that
replicas starting together migrate once. A database migrated by a newer server (an
unknown number) is refused rather than guessed at.
"""

from __future__ import annotations

COMMIT_FUNCTION = """CREATE FUNCTION agentloop_commit(
    s_ids text[], s_headers bytea[], s_create_ns bigint[], s_drivers text[],
    s_options bytea[], s_follows bigint[], s_counts bigint[], s_turns integer[],
    s_fences bigint[],
    e_sessions text[], e_seqs bigint[], e_kinds integer[], e_events bytea[],
    p_sessions text[], p_entries bigint[], p_kinds text[], p_messages bytea[],
    t_sessions text[], t_entries bigint[],
    r_agents text[], r_ids text[], r_methods text[], r_answers bytea[], r_sessions text[],
    r_stored_ns bigint[], channel text
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    refused boolean;
    stored record;
BEGIN
    FOR i IN 1 .. coalesce(array_length(s_ids, 1), 0) LOOP
        IF s_headers[i] IS NOT NULL THEN
            INSERT INTO sessions (session_id, header, create_ns)
                VALUES (s_ids[i], s_headers[i], s_create_ns[i]) ON CONFLICT DO NOTHING;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'AL409', MESSAGE = s_ids[i];
            END IF;
        END IF;
        refused := false;
        IF s_counts[i] > 0 OR s_drivers[i] <> '' OR s_options[i] IS NOT NULL THEN
            UPDATE sessions SET
                event_count = event_count + s_counts[i],
                turn_count = greatest(turn_count, s_turns[i]),
                driver = CASE WHEN s_drivers[i] <> '' THEN s_drivers[i] ELSE driver END,
                disposed_ns = CASE WHEN s_drivers[i] <> '' THEN 0 ELSE disposed_ns END,
                options = coalesce(s_options[i], options)
            WHERE session_id = s_ids[i]
                AND (s_counts[i] = 0 OR event_count = s_follows[i])
                AND (s_fences[i] = 0 OR fence = s_fences[i]);
            refused := NOT FOUND;
        ELSIF s_fences[i] <> 0 THEN
            PERFORM 1 FROM sessions WHERE session_id = s_ids[i] AND fence = s_fences[i]
                FOR SHARE;
            refused := NOT FOUND;
        END IF;
        IF refused THEN
            SELECT fence, event_count INTO stored FROM sessions WHERE session_id = s_ids[i];
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'AL404', MESSAGE = s_ids[i];
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'AL412', MESSAGE = s_ids[i],
                DETAIL = stored.fence || ' ' || stored.event_count;
        END IF;
        IF s_counts[i] > 0 THEN
            PERFORM pg_notify(channel, s_ids[i]);
        END IF;
    END LOOP;
    IF cardinality(e_sessions) > 0 THEN
        INSERT INTO events (session_id, seq, kind, event)
            SELECT * FROM unnest(e_sessions, e_seqs, e_kinds, e_events);
    END IF;
    IF cardinality(p_sessions) > 0 THEN
        INSERT INTO inbox (session_id, entry_id, kind, message)
            SELECT * FROM unnest(p_sessions, p_entries, p_kinds, p_messages);
    END IF;
    IF cardinality(t_sessions) > 0 THEN
        DELETE FROM inbox USING unnest(t_sessions, t_entries) AS taken (session_id, entry_id)
            WHERE inbox.session_id = taken.session_id AND inbox.entry_id = taken.entry_id;
    END IF;
    IF cardinality(r_agents) > 0 THEN
        INSERT INTO requests (agent_id, request_id, method, response, session_id, stored_at)
            SELECT a, r, m, ans, s, CASE WHEN ns = 0 THEN now()
                    ELSE timestamptz 'epoch' + (ns / 1000) * interval '1 microsecond' END
                FROM unnest(r_agents, r_ids, r_methods, r_answers, r_sessions, r_stored_ns)
                    AS given (a, r, m, ans, s, ns)
            ON CONFLICT DO NOTHING;
    END IF;
END
$$"""
"""Everything a group commit writes, in one statement: its own transaction (one round
trip, the NOTIFY sent at its commit). Per session (`s_*`, in the commit's order): the
creation, then one UPDATE that is the fence (the stored count is the one the events
follow, and the claim is the writer's) and moves the count, the driver and the options;
then the events, inbox entries put and taken, and request records of every session,
each as one statement over arrays. A refusal raises, so nothing of the commit stays:
`AL409` (the session to create exists), `AL404` (no such session), `AL412` (another
writer: DETAIL is the stored claim and count)."""

NOTIFY_IN_COMMIT = """        IF s_counts[i] > 0 THEN
            PERFORM pg_notify(channel, s_ids[i]);"""

COMMIT_FUNCTION_7 = COMMIT_FUNCTION.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
).replace(
    NOTIFY_IN_COMMIT,
    NOTIFY_IN_COMMIT.replace("s_counts[i] > 0", "s_counts[i] > 0 AND channel <> ''"),
)
"""Migration 7's function: migration 6's, which sends no NOTIFY when `channel` is empty.

A NOTIFY inside the commit's transaction takes a lock, at commit, that every notifying
transaction of the database server waits for until the holder's WAL is flushed: the
commits of all replicas then flush one after another (no group commit of the WAL:
measured by `bench.pg_commit_bench`, four committers made a third to a half of the
commits a second). The store sends its notifications after the commit instead
(`PostgresStore.commit`), in a statement of their own that writes nothing to flush."""

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
    (
        6,
        "a group commit in one statement: agentloop_commit",
        [COMMIT_FUNCTION],
    ),
    (
        7,
        "agentloop_commit notifies nobody given no channel (the store notifies after it)",
        [COMMIT_FUNCTION_7],
    ),
]
"""(number, what it does, statements), in order; append, never edit a released one."""

MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS agentloop_migrations (
    number integer PRIMARY KEY,
    description text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""

LOCK_KEY = 0x6167656E746C6F6F  # "agentloo": the advisory lock of migrations
