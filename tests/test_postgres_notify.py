"""The wake-up of other replicas' readers: a NOTIFY after each commit, not inside it.

A NOTIFY inside the commit's transaction serialises the commits of every replica
through their WAL flushes (migration 7). The store sends it after the commit instead,
on a connection of its own: a reader on another replica is woken once the events are
stored, and a commit that stores no events wakes nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from server.stores import Commit, SessionWrites
from server.stores.postgres import NOTIFIER, PostgresStore
from tests.postgres import drop_database, fresh_database
from tests.stores import append_events, create_session
from tests.test_store_conformance import entry, header, turns

WAKE_BOUND = 30.0
"""Seconds a woken wait may take at most here; the waits themselves are far longer."""


@pytest.fixture
async def replicas(postgres_server: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    dsn = await fresh_database(postgres_server)
    writer, reader = PostgresStore(dsn, lease_seconds=1.0), PostgresStore(dsn, lease_seconds=1.0)
    await writer.open()
    await reader.open()
    try:
        yield writer, reader
    finally:
        await writer.close()
        await reader.close()
        await drop_database(postgres_server, dsn)


async def test_a_commit_wakes_another_stores_reader_once_its_events_are_stored(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    writer, reader = replicas
    await create_session(writer, "s", header())
    await reader.wait_for_events("s", 0)  # its listener is connected
    waiting = asyncio.create_task(reader.wait_for_events("s", 10 * WAKE_BOUND))
    await asyncio.sleep(0)
    await append_events(writer, "s", turns(1))
    await asyncio.wait_for(waiting, WAKE_BOUND)  # woken, not timed out
    assert await reader.read("s", 1, 100) == turns(1)


async def test_the_commit_function_sends_no_notify_and_the_notifier_does(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    writer, _ = replicas
    heard: list[str] = []
    listener = await asyncpg.connect(writer.dsn)
    try:
        await listener.add_listener("agentloop_events", lambda *a: heard.append(str(a[3])))
        await create_session(writer, "s", header())
        await writer.commit(Commit({"s": SessionWrites(inbox_put=[entry(1, "m")])}))
        await append_events(writer, "s", turns(1))
        for _ in range(200):  # the notification follows the commit on its own connection
            if heard:
                break
            await asyncio.sleep(0.05)
        await listener.execute("SELECT 1")  # anything pending has been delivered
        assert heard == ["s"]  # the events' commit only; none for the creation or the inbox
        names = await listener.fetch(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
        )
        assert NOTIFIER in {row["application_name"] for row in names}
    finally:
        await listener.close()
