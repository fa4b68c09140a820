"""The facade without `async`: for scripts, notebooks and synchronous back ends.

`SyncClient` runs an `agentloop.Client` on an event loop of its own, in a background
thread, and waits for each call: exactly the same verbs (a test compares the two),
the same turns (found by their message's request id, reconnecting by themselves),
plain return values and iterators:

    with connect_sync("127.0.0.1:50051") as client:
        client.create("a", provider="scripted")
        turn = client.send("a", "hi")
        for event in turn:  # the turn that answers it, to its turn_end
            print(event)
        print(turn.view().text)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from agentloop.client import Client, connect
from agentloop.conversation import Conversation
from agentloop.stream import SessionStream
from agentloop.turns import Turn
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

__all__ = ["SyncClient", "SyncConversation", "SyncStream", "SyncTurn", "connect_sync"]


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

    def iterate(self, iterator: AsyncIterator[T]) -> Iterator[T]:
        """The items of an async iterator of the loop, each waited for here."""
        while True:
            try:
                yield self.run(_await(anext(iterator)))
            except StopAsyncIteration:
                return

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _await(awaitable: Awaitable[R]) -> R:
    return await awaitable


def _blocking(
    verb: Callable[Concatenate[Any, P], Awaitable[R]],
) -> Callable[Concatenate[Any, P], R]:
    """An async method as a method that waits for its answer on the owner's loop.

    The owner has `_loop` and `_async`, the asynchronous object whose method it calls.
    """

    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._loop.run(_await(verb(self._async, *args, **kwargs)))  # type: ignore[no-any-return]

    call.__name__ = verb.__name__
    call.__doc__ = verb.__doc__
    call.__wrapped__ = verb  # type: ignore[attr-defined]  # inspect.signature reads it
    return call


class SyncTurn:
    """The turn that answers a message: iterate its events (to its `turn_end`)."""

    def __init__(self, turn: Turn, loop: _LoopThread) -> None:
        self.turn = turn
        """The asynchronous turn underneath (its `end`, `dropped`, `steering`...)."""
        self._async = turn
        self._loop = loop

    def __iter__(self) -> Iterator[ev.SessionEvent]:
        return self.events()

    def events(self) -> Iterator[ev.SessionEvent]:
        """The events of the answering turn, in order, ending with its `turn_end`."""
        return self._loop.iterate(self.turn.events())

    def text_deltas(self) -> Iterator[str]:
        """The turn's answer as it streams: text deltas only, never tool arguments."""
        return self._loop.iterate(self.turn.text_deltas())

    result = _blocking(Turn.result)
    view = _blocking(Turn.view)


class SyncStream:
    """A session's events from a sequence number, across reconnects, without `async`."""

    def __init__(self, stream: SessionStream, loop: _LoopThread) -> None:
        self.stream = stream
        """The asynchronous stream underneath (its `cursor`, `reconnects`, `ended`...)."""
        self._async = stream
        self._loop = loop

    def __iter__(self) -> Iterator[ev.SessionEvent]:
        return self._loop.iterate(aiter(self.stream))

    def batches(self) -> Iterator[api.StreamSessionEventsResponse]:
        """Every response, across reconnects, until the server ends the stream."""
        return self._loop.iterate(self.stream.batches())

    next_batch = _blocking(SessionStream.next_batch)
    next_event = _blocking(SessionStream.next_event)
    take = _blocking(SessionStream.take)

    def unread(self, events: list[ev.SessionEvent]) -> None:
        """Give back the unconsumed tail of what `take` returned."""
        self.stream.unread(events)

    def close(self) -> None:
        """End the call (a later read opens a new one from `cursor`)."""
        self._loop.loop.call_soon_threadsafe(self.stream.close)


class SyncConversation:
    """Message after message to one agent, every turn read from one stream."""

    def __init__(self, conversation: Conversation, loop: _LoopThread) -> None:
        self.conversation = conversation
        self._loop = loop

    def send(self, text: str, *, request_id: str = "", steer: bool = False) -> SyncTurn:
        """`SyncClient.send` to this agent; the turn reads the shared stream."""
        turn = self._loop.run(self.conversation.send(text, request_id=request_id, steer=steer))
        return SyncTurn(turn, self._loop)

    def close(self) -> None:
        """End the stream."""
        self._loop.loop.call_soon_threadsafe(self.conversation.close)

    def __enter__(self) -> SyncConversation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class SyncClient:
    """`agentloop.Client` with every verb blocking until its answer."""

    def __init__(self, connecting: Callable[[], Client]) -> None:
        self._loop = _LoopThread()

        async def make() -> Client:  # channels belong to the loop they are made on
            return connecting()

        self.client = self._loop.run(make())
        """The asynchronous client underneath (its raw stubs run on the client's loop)."""
        self._async = self.client

    def send(
        self,
        agent_id: str,
        text: str,
        *,
        request_id: str = "",
        steer: bool = False,
        stream: SyncStream | None = None,
    ) -> SyncTurn:
        """Send (or steer) a message; the turn that answers it (`stream`: see `send`)."""
        shared = stream.stream if stream is not None else None
        turn = self._loop.run(
            self.client.send(agent_id, text, request_id=request_id, steer=steer, stream=shared)
        )
        return SyncTurn(turn, self._loop)

    def conversation(self, agent_id: str) -> SyncConversation:
        """Message after message to one agent over one stream of its session."""
        return SyncConversation(self.client.conversation(agent_id), self._loop)

    def stream(
        self,
        *,
        agent_id: str = "",
        session_id: str = "",
        from_seq: int = 0,
        replay_only: bool = False,
    ) -> SyncStream:
        """A session's events from `from_seq`, reconnecting after a failure."""
        stream = self.client.stream(
            agent_id=agent_id, session_id=session_id, from_seq=from_seq, replay_only=replay_only
        )
        return SyncStream(stream, self._loop)

    def stream_agent_events(self) -> Iterator[fac.StreamAgentEventsResponse]:
        """Every agent's live events and turn ends, server-wide (`Client.stream_agent_events`)."""
        return self._loop.iterate(self.client.stream_agent_events())

    create = _blocking(Client.create)
    resume = _blocking(Client.resume)
    dispose = _blocking(Client.dispose)
    get_agent = _blocking(Client.get_agent)
    list_agents = _blocking(Client.list_agents)
    drain = _blocking(Client.drain)
    steer = _blocking(Client.steer)
    inject = _blocking(Client.inject)
    cancel = _blocking(Client.cancel)
    wait_idle = _blocking(Client.wait_idle)
    get_session = _blocking(Client.get_session)
    list_sessions = _blocking(Client.list_sessions)
    list_events = _blocking(Client.list_events)
    fork = _blocking(Client.fork)
    approvals = _blocking(Client.approvals)
    resolve_approval = _blocking(Client.resolve_approval)
    delete_session = _blocking(Client.delete_session)
    compact = _blocking(Client.compact)
    plugins = _blocking(Client.plugins)
    tool_sources = _blocking(Client.tool_sources)
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


def connect_sync(
    address: str,
    *,
    token: str = "",
    ca_file: str = "",
    cert_file: str = "",
    key_file: str = "",
    tls: bool | None = None,
    timeout: float | None = None,
) -> SyncClient:
    """A blocking client of the server at `address`; the arguments as for `connect`."""
    return SyncClient(
        lambda: connect(
            address,
            token=token,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            tls=tls,
            timeout=timeout,
        )
    )
