"""The PostgreSQL session store (asyncpg): the same interface as SQLite, for many replicas.

Each group commit is one transaction, sent as one statement (`postgres_commit`: one
round trip); the NOTIFY that wakes other replicas' readers follows it, off its path.
A session's `event_count` column is the fence: an append updates it only where it
still equals the count the append follows, so two writers of one session
serialise on that row and the second one finds the count moved and is refused
(`StoreConflict`), whatever its timing. The count is also what a load checks the log
against (`check_count`). Reads run on the pool's other connections, concurrently with
commits.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable

import asyncpg

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import (
    AgentLoopError,
    AlreadyExists,
    FailedPrecondition,
    SessionDamaged,
    SessionNotFound,
)
from server.stores import (
    FIRST_SEQ,
    Answer,
    Commit,
    InboxEntry,
    RequestRecord,
    SessionSummary,
    StoreConflict,
    StoredSession,
    StoreUnavailable,
    check_count,
    decode_entry,
    decode_events,
    decode_log,
    fork_boundary,
)
from server.stores.kinds import KIND_NAMES, TURN_END, TURN_START
from server.stores.postgres_commit import COMMIT, arguments, refusal, witness
from server.stores.postgres_outage import OUTAGES, StoreHealth, outages_unavailable
from server.stores.postgres_pool import create_pool, session_settings
from server.stores.postgres_schema import LOCK_KEY, MIGRATIONS, MIGRATIONS_TABLE

log = logging.getLogger(__name__)

POOL_SIZE = 8

CHANNEL = "agentloop_events"
"""The NOTIFY channel: each commit that stores events names their session on it."""

NOTIFY = "SELECT pg_notify($1, session_id) FROM unnest($2::text[]) AS session_id"
"""Wake the readers of sessions: a statement of its own, which writes nothing to flush."""

NOTIFIER = "agentloop-notify"
"""The `application_name` of the connection that sends the notifications."""

UNSURE = "answer lost"
"""`Commit.unsure` of an attempt whose connection broke before its answer came."""

Conn = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy

INSERT_REQUEST = (
    "INSERT INTO requests (agent_id, request_id, method, response, session_id, stored_at)"
    " VALUES ($1, $2, $3, $4, $5, CASE WHEN $6::bigint = 0 THEN now()"
    " ELSE timestamptz 'epoch' + ($6::bigint / 1000) * interval '1 microsecond' END)"
    " ON CONFLICT DO NOTHING"
)
"""A request record; its time ($6, ns since the epoch) is now when 0."""


@outages_unavailable(lambda store: store.health)
class PostgresStore:
    """Sessions in a PostgreSQL database, shared by every replica that points at it."""

    persistent = True
    remote = True

    def __init__(self, dsn: str, pool_size: int = POOL_SIZE, lease_seconds: float = 5.0) -> None:
        self.dsn = dsn
        self.pool_size = pool_size
        self.lease_seconds = lease_seconds
        """The replicas' lease time, which the connections' timeouts derive from."""
        self.health = StoreHealth(self._probe)
        self.may_write: Callable[[], bool] = lambda: True
        """False while this replica must not act (its lease renewal is late): commits wait."""
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._notifier: asyncpg.Connection | None = None
        self._to_notify: set[str] = set()
        self._notifying: asyncio.Task[None] | None = None
        self._leases: dict[str, asyncpg.Connection] = {}

    async def open(self) -> None:
        """Connect and bring the schema up to date."""
        await self.pool()

    async def close(self) -> None:
        """Stop probing; close the listening connection, the leases' and the pool."""
        await self.health.close()
        if self._notifying is not None:
            self._notifying.cancel()
            self._notifying = None
        if self._notifier is not None:
            self._notifier.terminate()
            self._notifier = None
        for name in list(self._leases):
            await self.release_lease(name)
        if self._listener is not None:
            self._listener.terminate()
            self._listener = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def pool(self) -> asyncpg.Pool:
        """The connection pool (connected and migrated on first use)."""
        if self._pool is None:
            pool = await create_pool(self.dsn, self.pool_size, self.lease_seconds)
            try:
                async with pool.acquire() as conn:
                    await migrate(conn)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
        return self._pool

    async def _probe(self) -> None:
        """One round trip to the database (the health's reconnect attempts)."""
        pool = await self.pool()
        await pool.fetchval("SELECT 1")

    # -- writes ------------------------------------------------------------------------

    async def commit(self, commit: Commit) -> None:
        """Write the whole commit as one statement (`postgres_commit`): one round trip.

        An outage is `StoreUnavailable`. An attempt cut off around its end (the
        connection broke before its answer came) may have committed: the commit is
        marked `unsure`, and a retry of it that is then refused as a second writer
        checks whether that attempt's own rows are stored (`witness`) before failing.
        """
        if not self.may_write():  # retried by the journal until a renewal or a fence decides
            raise StoreUnavailable("this replica's leases are not renewed in time; retrying")
        if commit.empty():
            return
        args = arguments(commit, "")  # no NOTIFY inside: `_wake_readers` sends it after
        try:
            pool = await self.pool()
            await pool.execute(COMMIT, *args)
            commit.unsure = ""
            self._wake_readers(commit)
            return
        except OUTAGES:
            commit.unsure = UNSURE  # did it commit? known at the retry
            raise  # StoreUnavailable, by the class's wrapper
        except asyncpg.UniqueViolationError as error:  # a second writer raced the fence
            refused: AgentLoopError = StoreConflict(str(error))
        except asyncpg.PostgresError as error:
            found = refusal(error, commit)
            if found is None:
                self.health.failed()
                refusing = "the session store refused the commit; retry later"
                raise StoreUnavailable(refusing) from error
            refused = found
        lost = commit.unsure and isinstance(refused, StoreConflict | AlreadyExists)
        if lost and await self._landed(commit):
            commit.unsure = ""
            self._wake_readers(commit)
            return  # the attempt whose answer was lost had committed: nothing to redo
        raise refused

    def _wake_readers(self, commit: Commit) -> None:
        """NOTIFY the sessions whose events `commit` stored, after it and off its path.

        Inside the commit's transaction a NOTIFY would take a lock that serialises the
        commits of every replica until each one's WAL is flushed (`postgres_schema`,
        migration 7). Sent after the commit, on a connection of its own, one statement
        at a time for every session committed meanwhile: a reader woken finds the events
        stored. A notification lost (an outage) costs a reader a delay, never an event
        (`wait_for_events`).
        """
        self._to_notify.update(s for s, writes in commit.sessions.items() if writes.events)
        if self._to_notify and self._notifying is None:
            loop = asyncio.get_running_loop()
            self._notifying = loop.create_task(self._notify(), name="postgres-notify")

    async def _notify(self) -> None:
        try:
            while self._to_notify:
                session_ids = sorted(self._to_notify)
                self._to_notify.clear()
                try:
                    if self._notifier is None or self._notifier.is_closed():
                        self._notifier = None
                        settings = session_settings(self.lease_seconds)
                        self._notifier = await asyncpg.connect(
                            self.dsn,
                            timeout=max(self.lease_seconds, 1.0),
                            server_settings=settings | {"application_name": NOTIFIER},
                        )
                    await self._notifier.execute(NOTIFY, CHANNEL, session_ids)
                except Exception as error:  # best effort: the readers' waits are bounded
                    log.debug("notifying %d session(s) failed: %r", len(session_ids), error)
                    if self._notifier is not None:
                        self._notifier.terminate()
                        self._notifier = None
        finally:
            self._notifying = None

    async def _landed(self, commit: Commit) -> bool:
        """Whether an earlier attempt of `commit` committed: its own rows are stored."""
        found = witness(commit)
        if found is None:
            return False
        query, args = found
        pool = await self.pool()
        return bool(await pool.fetchval(query, *args))

    async def fork(
        self,
        source_id: str,
        boundary_seq: int | None,
        new_id: str,
        header: session_pb2.SessionHeader,
    ) -> int:
        """Copy the source's events up to a `turn_end` into a new session, atomically."""
        pool = await self.pool()
        async with pool.acquire() as conn, conn.transaction():
            count = await conn.fetchval(
                "SELECT event_count FROM sessions WHERE session_id = $1 FOR SHARE", source_id
            )
            if count is None:
                raise SessionNotFound(source_id)
            kind_at = None
            if boundary_seq is not None:
                kind = await conn.fetchval(
                    "SELECT kind FROM events WHERE session_id = $1 AND seq = $2",
                    source_id,
                    boundary_seq,
                )
                kind_at = KIND_NAMES.get(kind, "unknown") if kind is not None else None
            last = await conn.fetchval(
                "SELECT max(seq) FROM events WHERE session_id = $1 AND kind = $2",
                source_id,
                TURN_END,
            )
            boundary = fork_boundary(source_id, boundary_seq, count, kind_at, last)
            turn_start = await conn.fetchval(
                "SELECT event FROM events WHERE session_id = $1 AND kind = $2 AND seq <= $3"
                " ORDER BY seq DESC LIMIT 1",
                source_id,
                TURN_START,
                boundary,
            )
            turns = ev.SessionEvent.FromString(turn_start).turn_start.turn if turn_start else 0
            seed = boundary - FIRST_SEQ + 1
            header.seed_length = seed
            try:
                await conn.execute(
                    "INSERT INTO sessions"
                    " (session_id, header, create_ns, event_count, turn_count, options)"
                    " SELECT $1, $2, $3, $4, $5, options FROM sessions WHERE session_id = $6",
                    new_id,
                    header.SerializeToString(),
                    header.create_time.ToNanoseconds(),
                    seed,
                    turns,
                    source_id,
                )
            except asyncpg.UniqueViolationError:
                raise AlreadyExists(f'session "{new_id}" already exists') from None
            await conn.execute(
                "INSERT INTO events SELECT $1, seq, kind, event FROM events"
                " WHERE session_id = $2 AND seq <= $3",
                new_id,
                source_id,
                boundary,
            )
        return seed

    async def driven_by(self, agent_id: str) -> list[str]:
        """The sessions `agent_id` drove, the most recent first."""
        pool = await self.pool()
        rows = await pool.fetch(
            "SELECT session_id FROM sessions WHERE driver = $1"
            " ORDER BY create_ns DESC, session_id DESC",
            agent_id,
        )
        return [row["session_id"] for row in rows]

    async def adopt_pending(self, agent_id: str, session_id: str) -> list[InboxEntry]:
        """Move the other sessions' inbox entries of `agent_id` to `session_id`."""
        pool = await self.pool()
        async with pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT inbox.session_id, entry_id, kind, message FROM inbox"
                " JOIN sessions USING (session_id)"
                " WHERE sessions.driver = $1 AND inbox.session_id <> $2"
                " ORDER BY sessions.create_ns, inbox.session_id, entry_id FOR UPDATE OF inbox",
                agent_id,
                session_id,
            )
            start = await conn.fetchval(
                "SELECT coalesce(max(entry_id), 0) FROM inbox WHERE session_id = $1", session_id
            )
            moved = []
            for offset, row in enumerate(rows, start=1):
                await conn.execute(
                    "DELETE FROM inbox WHERE session_id = $1 AND entry_id = $2",
                    row["session_id"],
                    row["entry_id"],
                )
                await conn.execute(
                    "INSERT INTO inbox VALUES ($1, $2, $3, $4)",
                    session_id,
                    start + offset,
                    row["kind"],
                    row["message"],
                )
                moved.append(decode_entry(start + offset, row["kind"], row["message"]))
        return moved

    async def delete(self, session_id: str, answer: Answer | None = None) -> int:
        """Remove the session, its inbox and its request records, in one transaction.

        Refused (`SESSION_IN_USE`) while a lease names it (a live agent on some replica,
        or an orphan about to be taken over). The session row is locked first: a resume
        that takes a lease meanwhile waits at its claim and then finds no session.
        """
        pool = await self.pool()
        async with pool.acquire() as conn, conn.transaction():
            count = await conn.fetchval(
                "SELECT event_count FROM sessions WHERE session_id = $1 FOR UPDATE", session_id
            )
            if count is None:
                raise SessionNotFound(session_id)
            owner = await conn.fetchval(
                "SELECT agent_id FROM leases WHERE session_id = $1", session_id
            )
            if owner is not None:
                raise FailedPrecondition(
                    f'session "{session_id}" is driven by live agent "{owner}" on a replica:'
                    " dispose it first",
                    "SESSION_IN_USE",
                    session_id=session_id,
                    agent_id=owner,
                )
            await conn.execute("DELETE FROM requests WHERE session_id = $1", session_id)
            await conn.execute("DELETE FROM sessions WHERE session_id = $1", session_id)  # cascades
            if answer is not None:
                record = answer(int(count))
                await conn.execute(
                    INSERT_REQUEST,
                    record.agent_id, record.request_id, record.method, record.response, "",
                    record.stored_ns,
                )  # fmt: skip
        return int(count)

    async def mark_disposed(self, session_id: str, at_ns: int) -> None:
        """Record the disposal of the session's driver (a session gone meanwhile: nothing)."""
        pool = await self.pool()
        await pool.execute(
            "UPDATE sessions SET disposed_ns = $2 WHERE session_id = $1", session_id, at_ns
        )

    async def drop_requests(self, before_ns: int, limit: int) -> int:
        """Remove up to `limit` request records older than `before_ns`.

        Small batches: autovacuum keeps up with them.
        """
        pool = await self.pool()
        status = await pool.execute(
            "DELETE FROM requests WHERE ctid IN (SELECT ctid FROM requests"
            " WHERE stored_at < to_timestamp($1::float8 / 1e9) LIMIT $2)",
            before_ns,
            limit,
        )
        return int(status.split()[-1])

    async def reclaim(self) -> None:
        """Autovacuum gives dead rows back: nothing to do here."""

    async def try_lease(self, name: str) -> bool:
        """An advisory lock on a connection of its own, held until `release_lease`.

        If this replica dies, its connection closes and the lock is free again.
        """
        if name in self._leases:
            return True
        conn = await asyncpg.connect(self.dsn)
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        if await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
            self._leases[name] = conn
            return True
        await conn.close()
        return False

    async def release_lease(self, name: str) -> None:
        """Close the lease's connection: the lock goes with it."""
        conn = self._leases.pop(name, None)
        if conn is not None:
            await conn.close()

    async def claim(self, session_id: str) -> int:
        """A new claim token for the session."""
        pool = await self.pool()
        token = await pool.fetchval(
            "UPDATE sessions SET fence = fence + 1 WHERE session_id = $1 RETURNING fence",
            session_id,
        )
        if token is None:
            raise SessionNotFound(session_id)
        return int(token)

    async def wait_for_events(self, session_id: str, seconds: float) -> None:
        """Return when a commit of any replica stored events of the session, or later.

        The wake-up is a NOTIFY sent with each commit; `seconds` bound the wait, so a
        notification lost (a reconnect) costs a delay, never an event: the events
        table stays the truth.
        """
        if self._listener is None or self._listener.is_closed():  # first use, or it died
            self._listener = None
            listener = await asyncpg.connect(self.dsn, timeout=max(self.lease_seconds, 1.0))
            await listener.add_listener(CHANNEL, self._notified)
            self._listener = listener
        event = asyncio.Event()
        self._waiters.setdefault(session_id, set()).add(event)
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(session_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[session_id]

    def _notified(self, conn: object, pid: int, channel: str, session_id: object) -> None:
        for event in self._waiters.get(str(session_id), ()):
            event.set()

    # -- reads -------------------------------------------------------------------------

    async def exists(self, session_id: str) -> bool:
        """Whether the session is stored."""
        pool = await self.pool()
        found = await pool.fetchval("SELECT 1 FROM sessions WHERE session_id = $1", session_id)
        return found is not None

    async def load(self, session_id: str, start: int = FIRST_SEQ) -> StoredSession:
        """The header, the events from `start` and the inbox, from one snapshot."""
        start = max(start, FIRST_SEQ)
        pool = await self.pool()
        async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            row = await conn.fetchrow(
                "SELECT header, options, driver, event_count FROM sessions WHERE session_id = $1",
                session_id,
            )
            if row is None:
                raise SessionNotFound(session_id)
            rows = await conn.fetch(
                "SELECT seq, event FROM events WHERE session_id = $1 AND seq >= $2 ORDER BY seq",
                session_id,
                start,
            )
            inbox = await conn.fetch(
                "SELECT entry_id, kind, message FROM inbox WHERE session_id = $1 ORDER BY entry_id",
                session_id,
            )
        options = row["options"]
        events = await decode_log(session_id, start, [(r["seq"], r["event"]) for r in rows])
        # The tail cut: damaged (events before `start` were not read, but are counted).
        check_count(
            session_id, row["event_count"], min(start - FIRST_SEQ, row["event_count"]) + len(events)
        )
        return StoredSession(
            session_pb2.SessionHeader.FromString(row["header"]),
            events,
            [decode_entry(r["entry_id"], r["kind"], r["message"]) for r in inbox],
            agent_pb2.AgentOptions.FromString(options) if options is not None else None,
            row["driver"],
        )

    async def read(self, session_id: str, start: int, end: int) -> list[ev.SessionEvent]:
        """The stored events in `[start, end)`."""
        start = max(start, FIRST_SEQ)
        pool = await self.pool()
        rows = await pool.fetch(
            "SELECT seq, event FROM events WHERE session_id = $1 AND seq >= $2 AND seq < $3"
            " ORDER BY seq",
            session_id,
            start,
            end,
        )
        return decode_events(session_id, start, [(r["seq"], r["event"]) for r in rows])

    async def summary(self, session_id: str) -> SessionSummary:
        """The header and counts of a session."""
        pool = await self.pool()
        row = await pool.fetchrow(
            "SELECT header, event_count, turn_count, disposed_ns,"
            " (SELECT count(*) FROM inbox WHERE inbox.session_id = sessions.session_id)"
            " AS pending FROM sessions WHERE session_id = $1",
            session_id,
        )
        if row is None:
            raise SessionNotFound(session_id)
        return SessionSummary(
            session_pb2.SessionHeader.FromString(row["header"]),
            row["event_count"],
            row["turn_count"],
            row["pending"],
            row["disposed_ns"],
        )

    async def list_ids(self) -> list[str]:
        """Every stored session id, sorted."""
        pool = await self.pool()
        rows = await pool.fetch('SELECT session_id FROM sessions ORDER BY session_id COLLATE "C"')
        return [r["session_id"] for r in rows]

    async def find_request(self, agent_id: str, request_id: str) -> RequestRecord | None:
        """The recorded answer of an earlier call, if any."""
        pool = await self.pool()
        row = await pool.fetchrow(
            "SELECT method, response FROM requests WHERE agent_id = $1 AND request_id = $2",
            agent_id,
            request_id,
        )
        return None if row is None else RequestRecord(agent_id, request_id, row[0], row[1])

    async def session_requests(self, session_id: str) -> list[RequestRecord]:
        """The request records written with the session, with their times (microseconds)."""
        pool = await self.pool()
        rows = await pool.fetch(
            "SELECT agent_id, request_id, method, response,"
            " (extract(epoch FROM stored_at) * 1000000)::bigint * 1000 AS stored_ns"
            ' FROM requests WHERE session_id = $1 ORDER BY agent_id COLLATE "C",'
            ' request_id COLLATE "C"',
            session_id,
        )
        return [RequestRecord(*row) for row in rows]

    async def request_ids(self, agent_id: str, limit: int) -> list[str] | None:
        """Every request id recorded for the agent; None when there are more than `limit`."""
        pool = await self.pool()
        rows = await pool.fetch(
            "SELECT request_id FROM requests WHERE agent_id = $1 LIMIT $2", agent_id, limit + 1
        )
        return [r["request_id"] for r in rows] if len(rows) <= limit else None


async def migrate(conn: Conn) -> None:
    """Apply the missing migrations, once, however many replicas start together."""
    await conn.execute("SET lock_timeout = 0")  # waiting for another replica's migration
    await conn.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)
    try:
        await conn.execute(MIGRATIONS_TABLE)
        applied = {r["number"] for r in await conn.fetch("SELECT number FROM agentloop_migrations")}
        known = {number for number, _, _ in MIGRATIONS}
        unknown = applied - known
        if unknown:
            raise SessionDamaged(
                "", f"the database has migrations {sorted(unknown)} this server does not know"
            )
        for number, description, statements in MIGRATIONS:
            if number in applied:
                continue
            async with conn.transaction():
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO agentloop_migrations (number, description) VALUES ($1, $2)",
                    number,
                    description,
                )
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)
        await conn.execute("RESET lock_timeout")
