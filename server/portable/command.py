"""`agentloop-server sessions ...`: export, import and move sessions, offline.

These run against a store directly (the SQLite file or the PostgreSQL database a
server's config names), not through a server: the file carries what no RPC shows
(pending inbox entries, the stored agent options, the last driver) exactly as
stored, and an import lands in the store in the store's own transactions.

Exit codes: 0 done, 1 refused (a corrupt file, a conflicting id, an unknown
session), 2 bad arguments or config.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from pathlib import Path
from typing import IO

from server.kernel.errors import AgentLoopError
from server.portable import jsonl
from server.portable.move import Moved, move_sessions
from server.portable.transfer import Totals, export_sessions, import_sessions, select
from server.settings.config import Config, ConfigError, load_config, override
from server.stores import SessionStore
from server.stores.postgres import PostgresStore
from server.stores.sqlite import SqliteStore


def store_of(config: Config) -> SessionStore:
    """The persistent store a config names (a memory store keeps nothing to move)."""
    if config.store == "postgres":
        return PostgresStore(config.postgres_dsn)
    if config.store == "memory":
        raise ConfigError("the config's store is memory: there are no stored sessions")
    return SqliteStore(Path(config.data_dir) / "agentloop.db", config.durability)


def parser() -> argparse.ArgumentParser:
    """The arguments of `agentloop-server sessions`."""
    top = argparse.ArgumentParser(
        prog="agentloop-server sessions",
        description="Export sessions to a portable file, or import them, against a store.",
    )
    top.add_argument("--config", help="YAML config naming the store (default: the defaults)")
    top.add_argument("--data-dir", help="directory of the SQLite store, overriding the config")
    top.add_argument("--postgres", metavar="DSN", help="a PostgreSQL store instead")
    sub = top.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = sub.add_parser("export", help="write sessions to a file (JSON lines)")
    export.add_argument("session_ids", nargs="*", metavar="SESSION_ID", help="default: all")
    export.add_argument("--match", default="", metavar="GLOB", help="sessions whose id matches")
    export.add_argument("-o", "--output", default="-", help="file to write (default: stdout)")
    imported = sub.add_parser("import", help="load a file's sessions into the store")
    imported.add_argument("file", help="a file written by export ('-': stdin)")
    move = sub.add_parser("move", help="copy every session into a PostgreSQL store, verified")
    move.add_argument("--to-postgres", required=True, metavar="DSN", help="the target store")
    return top


def main(argv: list[str]) -> int:
    """Run one action; print what it carried on stderr."""
    args = parser().parse_args(argv)
    try:
        config = load_config(args.config)
        if args.data_dir:
            config = override(config, data_dir=args.data_dir, store="sqlite")
        if args.postgres:
            config = override(config, postgres_dsn=args.postgres, store="postgres")
        store = store_of(config)
    except ConfigError as error:
        print(f"agentloop-server sessions: {error}", file=sys.stderr)
        return 2
    if args.action == "move":
        return run_move(store, PostgresStore(args.to_postgres))
    try:
        if args.action == "import":  # the whole file is checked before the store is opened
            source = nullcontext(sys.stdin) if args.file == "-" else open(args.file)  # noqa: SIM115
            with source as stream:
                sessions = jsonl.read_file(stream)
            totals = asyncio.run(_with(store, lambda s: import_sessions(s, sessions)))
        else:
            target = nullcontext(sys.stdout) if args.output == "-" else open(args.output, "w")  # noqa: SIM115
            with target as out:
                totals = asyncio.run(_with(store, lambda s: run_export(s, args, out)))
    except (AgentLoopError, OSError) as error:
        print(f"agentloop-server sessions {args.action}: {error}", file=sys.stderr)
        if args.action == "export" and args.output != "-":  # no partial file left behind
            Path(args.output).unlink(missing_ok=True)
        return 1
    print(
        f"{args.action}ed {totals.sessions} sessions, {totals.events} events,"
        f" {totals.inbox} pending inbox entries, {totals.requests} request records",
        file=sys.stderr,
    )
    return 0


async def _with(store: SessionStore, action: Callable[[SessionStore], Awaitable[Totals]]) -> Totals:
    await store.open()
    try:
        return await action(store)
    finally:
        await store.close()


async def run_export(store: SessionStore, args: argparse.Namespace, out: IO[str]) -> Totals:
    """Export the chosen sessions."""
    for session_id in args.session_ids:  # named ones must exist: refuse before writing
        await store.summary(session_id)
    ids = await select(store, args.session_ids, args.match)
    return await export_sessions(store, ids, out)


def say(text: str) -> None:
    """Progress, on stderr."""
    print(text, file=sys.stderr)


def run_move(source: SessionStore, target: SessionStore) -> int:
    """`move`: copy, verify, print the counts; rerun after an interruption to go on."""

    async def both() -> Moved:
        await source.open()
        try:
            await target.open()
            try:
                return await move_sessions(source, target, say)
            finally:
                await target.close()
        finally:
            await source.close()

    try:
        moved = asyncio.run(both())
    except (AgentLoopError, OSError) as error:
        print(f"agentloop-server sessions move: {error}", file=sys.stderr)
        return 1
    print(
        f"moved {moved.copied} sessions ({moved.skipped} already there); verified"
        f" {moved.sessions} sessions, {moved.events} events, {moved.inbox} pending inbox"
        f" entries, {moved.requests} request records: counts and checksums match",
        file=sys.stderr,
    )
    return 0
