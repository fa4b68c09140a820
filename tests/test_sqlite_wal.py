"""The SQLite store checkpoints by WAL pages; a WAL checkpointed whole starts over."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.sessions.session import SessionLog
from server.stores import sqlite as sqlite_store
from server.stores.sqlite import SqliteStore
from tests.stores import append_events, create_session

FRAME = 4096 + 24
"""A WAL frame: a page and its header."""


def turn_events(session: SessionLog, turn: int) -> list[ev.SessionEvent]:
    start = len(session.events)
    session.append("turn_start", ev.TurnStart(turn=turn, trigger=ev.TRIGGER_KIND_MESSAGE))
    for _ in range(8):
        session.append("assistant_chunk", ev.AssistantChunk(turn=turn, step=1))
    session.append("turn_end", ev.TurnEnd(turn=turn))
    return session.events[start:]


async def test_a_checkpoint_comes_every_so_many_pages_and_the_wal_then_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_PAGES", 64)
    store = SqliteStore(tmp_path / "agentloop.db")
    wal = tmp_path / "agentloop.db-wal"
    ids = [f"s{i}" for i in range(20)]
    logs = {i: SessionLog(i, session_pb2.SessionHeader()) for i in ids}
    turns = dict.fromkeys(ids, 0)

    async def commit_a_turn(session_id: str) -> None:
        turns[session_id] += 1
        await append_events(store, session_id, turn_events(logs[session_id], turns[session_id]))

    try:
        for session_id in ids:
            await create_session(store, session_id, session_pb2.SessionHeader())
        checkpoints = 0
        for _ in range(40):
            for session_id in ids:
                await commit_a_turn(session_id)
                if store._checkpointing is not None:  # let each checkpoint finish (no timing)
                    checkpoints += not store._checkpointing.done()
                    await store._checkpointing
        written = sum(len(log.events) for log in logs.values())
        assert written == 20 * 40 * 10 and checkpoints >= 10
        # Each commit writes a page or more: 800 commits would leave a WAL of 800+ frames
        # had it grown; starting over after each checkpoint, it holds about 64 pages.
        assert wal.stat().st_size < 200 * FRAME
        for session_id in ids:
            assert (await store.load(session_id)).events == logs[session_id].events
    finally:
        await store.close()
    assert not wal.exists() or wal.stat().st_size == 0  # a clean stop folds it in
