"""A SIGKILL in the middle of a retention sweep and of a move, then the invariants:
every session is whole or gone, none that should stay is lost, and a rerun finishes."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from server.lifecycle.factory import AgentFactory
from server.lifecycle.retention import DAY_NS, Sweeper
from server.lifecycle.runtime import build_runtime
from server.settings.config import Config
from server.settings.retention import Retention
from tests.postgres import drop_database, fresh_database
from tests.test_portable import ROOT, sessions_command
from tests.test_retention import stored

OLD, KEEP = 1500, 40
MOVED = 400

SWEEP = """
import asyncio, sys
from server.lifecycle.runtime import build_runtime
from server.lifecycle.factory import AgentFactory
from server.lifecycle.retention import Sweeper
from server.settings.config import Config
from server.settings.retention import Retention

async def main():
    factory = AgentFactory(build_runtime(Config(store="sqlite", data_dir=sys.argv[1])))
    await Sweeper(factory, Retention(idle_session_days=30, sweep_batch=10)).sweep()

asyncio.run(main())
"""


async def filled(data_dir: Path, old_sessions: int = OLD) -> AgentFactory:
    factory = AgentFactory(build_runtime(Config(store="sqlite", data_dir=str(data_dir))))
    old = time.time_ns() - 40 * DAY_NS
    await stored(factory, [f"old-{i:05d}" for i in range(old_sessions)], old)
    await stored(factory, [f"keep-{i}" for i in range(KEEP)], time.time_ns())
    await stored(factory, ["pending"], old, pending=True)
    return factory


def count(path: Path, sql: str) -> int:
    with sqlite3.connect(path, timeout=5) as db:
        return int(db.execute(sql).fetchone()[0])


async def kill_when(proc: asyncio.subprocess.Process, ready: object) -> None:
    """SIGKILL `proc` once `ready()` says so (it must still be running then)."""
    deadline = time.monotonic() + 60
    while not await ready():  # type: ignore[operator]
        assert proc.returncode is None, "it finished before it could be killed"
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    await proc.wait()


@pytest.mark.timeout(240)
async def test_a_sweep_killed_midway_loses_nothing_that_stays(tmp_path: Path) -> None:
    factory = await filled(tmp_path)
    await factory.runtime.store.close()
    db = tmp_path / "agentloop.db"
    total = OLD + KEEP + 1
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SWEEP, str(tmp_path), cwd=ROOT
    )

    async def some_gone() -> bool:
        return count(db, "SELECT COUNT(*) FROM sessions") < total - 20

    await kill_when(proc, some_gone)
    assert proc.returncode == -signal.SIGKILL
    factory = AgentFactory(build_runtime(Config(store="sqlite", data_dir=str(tmp_path))))
    store = factory.runtime.store
    try:
        left = await store.list_ids()
        assert OLD + KEEP + 1 > len(left) > KEEP + 1  # killed midway
        for session_id in left:  # every session left is whole: its three events
            assert len((await store.load(session_id)).events) == 3
        assert {f"keep-{i}" for i in range(KEEP)} | {"pending"} <= set(left)
        orphans = count(db, "SELECT COUNT(*) FROM events WHERE session_id NOT IN"
                            " (SELECT session_id FROM sessions)")  # fmt: skip
        assert orphans == 0
        report = await Sweeper(factory, Retention(idle_session_days=30)).sweep()
        assert report.sessions_swept == len(left) - KEEP - 1
        assert len(await store.list_ids()) == KEEP + 1
    finally:
        await store.close()


@pytest.mark.timeout(240)
async def test_a_move_killed_midway_resumes_and_verifies(
    tmp_path: Path, postgres_server: str
) -> None:
    factory = await filled(tmp_path, MOVED)
    await factory.runtime.store.close()
    dsn = await fresh_database(postgres_server)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "server", "sessions", "--data-dir", str(tmp_path),
            "move", "--to-postgres", dsn, cwd=ROOT, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        conn = await asyncpg.connect(dsn)

        async def some_copied() -> bool:
            tables = await conn.fetchval("SELECT to_regclass('sessions') IS NOT NULL")
            return bool(tables) and await conn.fetchval("SELECT count(*) FROM sessions") > 20

        await kill_when(proc, some_copied)
        copied = await conn.fetchval("SELECT count(*) FROM sessions")
        incomplete = await conn.fetchval(
            "SELECT count(*) FROM sessions s WHERE event_count <>"
            " (SELECT count(*) FROM events e WHERE e.session_id = s.session_id)"
        )
        await conn.close()
        total = MOVED + KEEP + 1
        assert 0 < copied < total and incomplete == 0  # whole sessions only
        code, err = await sessions_command(
            "--data-dir", str(tmp_path), "move", "--to-postgres", dsn, wait=180
        )
        assert code == 0, err
        assert f"({copied} already there); verified {total} sessions, {3 * total} events" in err
    finally:
        await drop_database(postgres_server, dsn)
