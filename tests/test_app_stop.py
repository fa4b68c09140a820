"""`App.stop` in process: bounded by the grace period, and nothing left running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentloop.v1 import agent_pb2
from agentloop.v1 import decision_pb2 as d
from server.edge.app import App
from server.kernel import seams as S
from server.kernel.seams import SeamRegistry
from server.settings.config import Config
from tests.harness import text_block

T = 10.0

NOTICE: S.Emit[None] = S.Emit("test/notice")
"""A seam of these tests only: notifications that carry nothing."""
"""A hang guard, never a measured time."""


@pytest.fixture
async def app() -> AsyncIterator[App]:
    app = App(Config(listen="127.0.0.1:0", store="memory", agents=()))
    await app.start()
    try:
        yield app
    finally:
        async with asyncio.timeout(T):
            await app.stop(grace=0)


class Stubborn:
    """A coroutine listener that ignores every abort signal; records its cancellation."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.cancelled: list[str] = []

    async def wait_forever(self, name: str) -> None:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(name)
            raise


async def test_a_listener_that_ignores_its_signal_is_cancelled_by_disposal(app: App) -> None:
    stubborn = Stubborn()

    async def prompt_submit(
        call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
    ) -> d.PromptDecision:
        await stubborn.wait_forever(call.agent_id)
        return await next_()

    app.runtime.seams.on(S.PROMPT_SUBMIT, prompt_submit)
    agent = await app.factory.create("stuck", agent_pb2.AgentOptions(provider="scripted"))
    agent.send([text_block("p")])
    async with asyncio.timeout(T):
        await stubborn.entered.wait()

    # Disposal cancels the turn's scope: the listener, which never looks at its signal,
    # is cancelled where it waits (a turn that outlasts the grace period anyway is
    # tests/test_cancel_scope.py's; the timeout is only a hang guard).
    async with asyncio.timeout(T):
        await app.stop(grace=0.1)

    assert stubborn.cancelled == ["stuck"]  # its driver was cancelled ...
    assert agent.driver is not None and agent.driver.done()
    assert app.factory.agents == {}  # ... and the agent torn down


async def test_a_stop_within_the_grace_period_ends_turns_disposed(app: App) -> None:
    started = asyncio.Event()

    async def prompt_submit(
        call: S.PromptSubmit, next_: S.Next[S.PromptSubmit, d.PromptDecision]
    ) -> d.PromptDecision:
        started.set()
        await call.signal.race(asyncio.Event().wait())  # honours the abort
        return await next_()

    app.runtime.seams.on(S.PROMPT_SUBMIT, prompt_submit)
    agent = await app.factory.create("polite", agent_pb2.AgentOptions(provider="scripted"))
    agent.send([text_block("p")])
    async with asyncio.timeout(T):
        await started.wait()
        await app.stop(grace=T)

    (end,) = [e.turn_end for e in agent.session.events if e.HasField("turn_end")]
    assert end.reason.WhichOneof("kind") == "disposed"


async def test_stop_cancels_the_emit_listeners_still_running(app: App) -> None:
    stubborn = Stubborn()

    async def observer(notice: None) -> None:
        await stubborn.wait_forever("observer")

    app.runtime.seams.on(NOTICE, observer)
    app.runtime.seams.emit(NOTICE, None, None)
    async with asyncio.timeout(T):
        await stubborn.entered.wait()
        await app.stop(grace=0)

    assert stubborn.cancelled == ["observer"]


async def test_seam_registry_close_cancels_and_awaits_its_tasks() -> None:
    seams = SeamRegistry()
    stubborn = Stubborn()
    finished: list[str] = []

    async def slow(notice: None) -> None:
        await stubborn.wait_forever("slow")

    async def quick(notice: None) -> None:
        finished.append("quick")

    seams.on(NOTICE, slow)
    seams.on(NOTICE, quick)
    seams.emit(NOTICE, None, None)
    async with asyncio.timeout(T):
        await stubborn.entered.wait()
        await seams.close()

    assert stubborn.cancelled == ["slow"]
    assert finished == ["quick"]
    assert seams.contained_failures == 0  # a cancellation at shutdown is not a failure
    await seams.close()  # nothing left: a second close returns at once


async def test_two_callers_stop_the_server_once(monkeypatch: pytest.MonkeyPatch) -> None:
    app = App(Config(listen="127.0.0.1:0", store="memory", agents=()))
    await app.start()
    closes: list[str] = []
    close = app.runtime.store.close

    async def counted_close() -> None:
        closes.append("store")
        await close()

    monkeypatch.setattr(app.runtime.store, "close", counted_close)
    async with asyncio.timeout(T):
        await asyncio.gather(app.stop(grace=0), app.stop(grace=0))
        await app.stop(grace=0)  # after the stop: returns at once
    assert closes == ["store"]


async def test_a_cancelled_caller_does_not_cut_the_stop_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = App(Config(listen="127.0.0.1:0", store="memory", agents=()))
    await app.start()
    closes: list[str] = []
    close = app.runtime.store.close

    async def counted_close() -> None:
        closes.append("store")
        await close()

    monkeypatch.setattr(app.runtime.store, "close", counted_close)
    impatient = asyncio.ensure_future(app.stop(grace=0))
    await asyncio.sleep(0)  # the stop has begun
    impatient.cancel()
    async with asyncio.timeout(T):
        await app.stop(grace=0)
    assert impatient.cancelled()
    assert closes == ["store"]
