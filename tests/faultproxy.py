"""A TCP proxy that can partition: between a replica and PostgreSQL, with no root needed.

`FaultProxy` listens on 127.0.0.1 and passes each connection's bytes to a target (a
TCP address or a Unix socket: the test PostgreSQL listens on one). A test turns faults
on and off while the connections stay open:
- `blackhole()`: bytes stop flowing both ways and new connections hang, as in a
  network partition (nothing is refused: the peers only see silence); `heal()` lets
  the held bytes through, late, as TCP would after the partition;
- `delay(seconds)`: every chunk waits that long before it is passed on;
- `cut()`: every open connection is closed at once (a reset).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

CHUNK = 65536

Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class FaultProxy:
    """One listening port in front of one target."""

    def __init__(self, open_target: Opener) -> None:
        self.open_target = open_target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._delay = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.heal()
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def blackhole(self) -> None:
        """Hold every byte, both ways, until `heal`."""
        self._flowing.clear()

    def heal(self) -> None:
        """Let bytes flow again (those held first)."""
        self._flowing.set()

    def delay(self, seconds: float) -> None:
        """Pass every chunk on after `seconds` (0: at once)."""
        self._delay = seconds

    def cut(self) -> None:
        """Close every open connection, both sides."""
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._flowing.wait()  # a partitioned network accepts nothing new either
        try:
            target_reader, target_writer = await self.open_target()
        except OSError:
            writer.close()
            return
        self._writers.update((writer, target_writer))
        pumps = [
            asyncio.create_task(self._pump(reader, target_writer)),
            asyncio.create_task(self._pump(target_reader, writer)),
        ]
        self._tasks.update(pumps)
        for pump in pumps:
            pump.add_done_callback(self._tasks.discard)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for side in (writer, target_writer):
            side.close()
            self._writers.discard(side)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await source.read(CHUNK)
                if not data:
                    return
                if self._delay:
                    await asyncio.sleep(self._delay)
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()


@contextlib.asynccontextmanager
async def postgres_proxy(dsn: str) -> AsyncIterator[tuple[FaultProxy, str]]:
    """A proxy in front of the PostgreSQL of `dsn` (a Unix-socket DSN), and a DSN through it."""
    parts = urlsplit(dsn)
    socket_dir = parse_qs(parts.query)["host"][0]
    port = parts.port or 5432
    path = f"{socket_dir}/.s.PGSQL.{port}"
    proxy = FaultProxy(lambda: asyncio.open_unix_connection(path))
    await proxy.start()
    user = parts.username or "postgres"
    try:
        yield proxy, f"postgresql://{user}@127.0.0.1:{proxy.port}{parts.path}"
    finally:
        await proxy.close()
