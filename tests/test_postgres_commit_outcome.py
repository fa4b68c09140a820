"""A commit whose outcome was lost (the connection broke around COMMIT) is retried right.

The journal retries a commit after an outage. If the attempt it could not confirm had
in fact committed, writing it again would find its own events stored and be refused
as a second writer (`ABORTED`, and the agent stopped), as a PostgreSQL restart under
load showed. The store remembers the attempt's transaction id and asks PostgreSQL for
its status before the retry: committed, the retry is done; aborted, it writes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from server.stores import Commit, SessionWrites, StoreConflict
from server.stores.postgres import PostgresStore
from tests.postgres import drop_database, fresh_database
from tests.stores import create_session
from tests.test_store_conformance import header, turns


@pytest.fixture
async def store(postgres_server: str) -> AsyncIterator[PostgresStore]:
    dsn = await fresh_database(postgres_server)
    s = PostgresStore(dsn, lease_seconds=1.0)
    await s.open()
    try:
        yield s
    finally:
        await s.close()
        await drop_database(postgres_server, dsn)


async def last_writer(store: PostgresStore, session_id: str) -> str:
    """The id of the transaction that last updated the session's row (this epoch)."""
    pool = await store.pool()
    return str(await pool.fetchval("SELECT xmin FROM sessions WHERE session_id = $1", session_id))


async def test_a_commit_that_landed_unconfirmed_is_not_written_again(
    store: PostgresStore,
) -> None:
    await create_session(store, "s", header())
    commit = Commit({"s": SessionWrites(events=turns(1))})
    await store.commit(commit)
    commit.unsure = await last_writer(store, "s")  # as if its COMMIT's answer was lost
    await store.commit(commit)  # the retry: done already
    assert (await store.load("s")).events == turns(1)
    assert commit.unsure == ""
    with pytest.raises(StoreConflict):  # a second writer with the same events is refused
        await store.commit(Commit({"s": SessionWrites(events=turns(1))}))


async def test_a_commit_whose_attempt_aborted_is_written(store: PostgresStore) -> None:
    await create_session(store, "s", header())
    pool = await store.pool()
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        aborted = str(await conn.fetchval("SELECT pg_current_xact_id()"))
        await transaction.rollback()
    commit = Commit({"s": SessionWrites(events=turns(1))}, unsure=aborted)
    await store.commit(commit)
    assert (await store.load("s")).events == turns(1)
