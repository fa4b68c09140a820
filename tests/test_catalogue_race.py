"""The read cache of stored sessions under concurrent readers (issue 27, item 6).

A reader that finds a stored session in the cache asks the store whether it changed;
while it waits, other readers may load enough sessions to evict it. The first reader
then answers from what it found, and the cache stays bounded: no `KeyError` (which a
client saw as `UNKNOWN` during takeovers).
"""

from __future__ import annotations

import asyncio

import pytest

from server.sessions.catalogue import READ_CACHE
from server.stores import SessionSummary
from tests.harness import Harness


async def test_a_cached_session_evicted_while_its_reader_waits_is_still_answered(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_ids = []
    for i in range(READ_CACHE + 1):
        agent = await harness.create(f"a{i}")
        session_ids.append(agent.session.session_id)
        await harness.factory.dispose(f"a{i}")
    catalogue = harness.factory.catalogue
    first, others = session_ids[0], session_ids[1:]
    await catalogue.session(first)  # cached

    store = harness.runtime.store
    summary = store.summary
    entered, gate = asyncio.Event(), asyncio.Event()

    async def gated(session_id: str) -> SessionSummary:
        if session_id == first and not gate.is_set():
            entered.set()
            await gate.wait()
        return await summary(session_id)

    monkeypatch.setattr(store, "summary", gated)
    reader = asyncio.create_task(catalogue.session(first))
    await entered.wait()  # the reader waits on the store
    for session_id in others:  # meanwhile READ_CACHE other sessions evict the first
        await catalogue.session(session_id)
    gate.set()
    found = await reader
    assert found.session_id == first
    assert (await catalogue.session(first)).session_id == first
