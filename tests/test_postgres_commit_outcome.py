"""A commit whose outcome was lost (the connection broke around its end) is retried right.

The journal retries a commit after an outage. If the attempt it could not confirm had
in fact committed, writing it again would find its own events stored and be refused
as a second writer (`ABORTED`, and the agent stopped), as a PostgreSQL restart under
load showed. The store marks such a commit `unsure`; a retry refused as a second
writer looks for the commit's own rows (its events' bytes, else its new header,
else its first inbox entry): stored, the retry is done; absent, the refusal stands.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from server.kernel.errors import AlreadyExists
from server.stores import Commit, SessionWrites, StoreConflict, StoreUnavailable
from server.stores.postgres import UNSURE, PostgresStore
from tests.faultproxy import postgres_proxy
from tests.postgres import drop_database, fresh_database
from tests.stores import create_session
from tests.test_store_conformance import entry, header, turns


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


async def test_a_commit_that_landed_unconfirmed_is_not_written_again(
    store: PostgresStore,
) -> None:
    await create_session(store, "s", header())
    commit = Commit({"s": SessionWrites(events=turns(1), inbox_put=[entry(1, "m")])})
    await store.commit(commit)
    commit.unsure = UNSURE  # as if its answer was lost
    await store.commit(commit)  # the retry: done already
    assert (await store.load("s")).events == turns(1)
    assert commit.unsure == ""
    other = turns(1)  # another writer's events at the same seqs: other bytes
    other[1].user_message.request_id = "another"
    with pytest.raises(StoreConflict):
        await store.commit(Commit({"s": SessionWrites(events=other)}, unsure=UNSURE))


async def test_a_creation_or_an_accepted_message_that_landed_is_not_written_again(
    store: PostgresStore,
) -> None:
    created = Commit({"s": SessionWrites(create=header(), driver="a")})
    await store.commit(created)
    created.unsure = UNSURE
    await store.commit(created)
    accepted = Commit({"s": SessionWrites(inbox_put=[entry(1, "m")])})
    await store.commit(accepted)
    accepted.unsure = UNSURE
    await store.commit(accepted)
    assert [e.message for e in (await store.load("s")).inbox] == [entry(1, "m").message]
    with pytest.raises(AlreadyExists):  # another creation of the id: not this commit's row
        await store.commit(Commit({"s": SessionWrites(create=header(2))}, unsure=UNSURE))


async def test_a_commit_whose_attempt_did_not_land_is_written(store: PostgresStore) -> None:
    await create_session(store, "s", header())
    commit = Commit({"s": SessionWrites(events=turns(1))}, unsure=UNSURE)
    await store.commit(commit)
    assert (await store.load("s")).events == turns(1)
    assert commit.unsure == ""


async def test_a_commit_whose_answer_is_cut_off_is_retried_without_a_conflict(
    postgres_server: str,
) -> None:
    dsn = await fresh_database(postgres_server)
    async with postgres_proxy(dsn) as (proxy, proxied):
        store = PostgresStore(proxied, lease_seconds=1.0)
        direct = await asyncpg.connect(dsn)
        try:
            await create_session(store, "s", header())
            commit = Commit({"s": SessionWrites(events=turns(1))})
            proxy.delay(2.0)  # each chunk waits: the statement, then its answer
            attempt = asyncio.create_task(store.commit(commit))
            while not await direct.fetchval(  # noqa: ASYNC110 - a database state, polled
                "SELECT count(*) FROM events"
            ):  # until it committed ...
                await asyncio.sleep(0.02)
            proxy.cut()  # ... and its answer lost on the way back
            with pytest.raises(StoreUnavailable):
                await attempt
            assert commit.unsure
            proxy.delay(0)
            await store.commit(commit)  # the journal's retry: found stored, not refused
            assert (await store.load("s")).events == turns(1) and not commit.unsure
        finally:
            await direct.close()
            await store.close()
    await drop_database(postgres_server, dsn)
