"""The facade without `async`: for scripts, notebooks and synchronous back ends.

`SyncClient` runs an `agentloop.Client` on an event loop of its own, in a background
thread, and waits for each call: the same verbs, the same turns (found by their
message's request id, reconnecting by themselves), plain return values:

    with connect_sync("127.0.0.1:50051") as client:
        client.create("a")
        for event in client.send("a", "hi"):  # the turn that answers it, to its turn_end
            print(event)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future
from typing import Any, Concatenate, ParamSpec, TypeVar

from agentloop.client import Client, connect
from agentloop.turns import Turn
from agentloop.v1 import session_event_pb2 as ev

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["SyncClient", "SyncTurn", "connect_sync"]


class _LoopThread:
    """An event loop running in a daemon thread, for coroutines handed over from others."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="agentloop-client", daemon=True
        )
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, R]) -> R:
        """Run `coroutine` on the loop and wait for its result (its error raises here)."""
        future: Future[R] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result()

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _await(awaitable: Awaitable[R]) -> R:
    return await awaitable


def _blocking(
    verb: Callable[Concatenate[Client, P], Awaitable[R]],
) -> Callable[Concatenate[SyncClient, P], R]:
    """`Client.verb` as a method of `SyncClient` that waits for its answer."""

    def call(self: SyncClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._loop.run(_await(verb(self.client, *args, **kwargs)))

    call.__name__ = verb.__name__
    call.__doc__ = verb.__doc__
    return call


class SyncTurn:
    """The turn that answers a message: iterate its events (to its `turn_end`)."""

    def __init__(self, turn: Turn, loop: _LoopThread) -> None:
        self.turn = turn
        """The asynchronous turn underneath (its `end`, `dropped`, `steering`...)."""
        self._loop = loop

    def __iter__(self) -> Iterator[ev.SessionEvent]:
        events = aiter(self.turn)
        while True:
            try:
                yield self._loop.run(_await(anext(events)))
            except StopAsyncIteration:
                return

    def result(self) -> ev.SessionEvent:
        """Read the turn to its end; its `turn_end` event."""
        return self._loop.run(self.turn.result())


class SyncClient:
    """`agentloop.Client` with every verb blocking until its answer."""

    def __init__(self, connecting: Callable[[], Client]) -> None:
        self._loop = _LoopThread()

        async def make() -> Client:  # channels belong to the loop they are made on
            return connecting()

        self.client = self._loop.run(make())
        """The asynchronous client underneath (its raw stubs run on the client's loop)."""

    def send(
        self, agent_id: str, text: str, *, request_id: str = "", steer: bool = False
    ) -> SyncTurn:
        """Send (or steer) a message; the turn that answers it."""
        turn = self._loop.run(self.client.send(agent_id, text, request_id=request_id, steer=steer))
        return SyncTurn(turn, self._loop)

    create = _blocking(Client.create)
    resume = _blocking(Client.resume)
    fork = _blocking(Client.fork)
    dispose = _blocking(Client.dispose)
    steer = _blocking(Client.steer)
    inject = _blocking(Client.inject)
    cancel = _blocking(Client.cancel)
    wait_idle = _blocking(Client.wait_idle)
    approvals = _blocking(Client.approvals)
    resolve_approval = _blocking(Client.resolve_approval)
    list_agents = _blocking(Client.list_agents)
    list_sessions = _blocking(Client.list_sessions)
    plugins = _blocking(Client.plugins)
    register_plugin = _blocking(Client.register_plugin)
    unregister_plugin = _blocking(Client.unregister_plugin)

    def close(self) -> None:
        """Close the channel and stop the client's thread."""
        self._loop.run(self.client.close())
        self._loop.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_sync(address: str, **options: Any) -> SyncClient:
    """A blocking client of the server at `address`; `options` as for `connect`."""
    return SyncClient(lambda: connect(address, **options))
