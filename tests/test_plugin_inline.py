"""The Python helper runs a handler that cannot suspend in place, with no task per call:
which handlers qualify, what they see, and how one that suspends after all goes on."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator
from typing import Any

from agentloop.plugin import sdk
from agentloop.plugin.inline import never_suspends, resumed
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import content_pb2, session_event_pb2
from tests.plugin_client import HandleStream, hook_client

SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="")


async def decides(call: hs.HookCall) -> None:
    return None


async def awaits(call: hs.HookCall) -> None:
    await asyncio.sleep(0)


async def iterates(calls: AsyncIterator[Any]) -> None:
    async for _ in calls:
        pass


async def enters(lock: asyncio.Lock) -> None:
    async with lock:
        pass


async def comprehends(calls: AsyncIterator[int]) -> list[int]:
    return [call async for call in calls]


class Handler:
    async def method(self, call: hs.HookCall) -> None:
        return None

    async def __call__(self, call: hs.HookCall) -> None:
        return None


def test_only_an_async_def_that_never_awaits_runs_in_place() -> None:
    assert never_suspends(decides)
    assert never_suspends(Handler().method)  # a bound method: judged by its function
    for handler in (awaits, iterates, enters, comprehends):
        assert not never_suspends(handler), handler.__name__
    assert not never_suspends(Handler())  # a callable object: run as a task
    assert not never_suspends(functools.partial(decides))
    assert not never_suspends(lambda call: decides(call))  # returns an awaitable
    assert not never_suspends(len)


def prompt(call_id: str, text: str) -> hs.HookCall:
    block = content_pb2.ContentBlock(text=content_pb2.TextBlock(text=text))
    return hs.HookCall(
        call_id=call_id,
        kind=hs.CALL_KIND_SEAM,
        seam=hs.SEAM_PROMPT_SUBMIT,
        prompt_submit=hs.PromptSubmitCall(content=[block]),
    )


def event_notice(call_id: str) -> hs.HookCall:
    event = session_event_pb2.SessionEvent(seq=int(call_id[1:]))
    return hs.HookCall(
        call_id=call_id,
        kind=hs.CALL_KIND_NOTIFICATION,
        seam=hs.SEAM_SESSION_EVENTS,
        session_event=hs.SessionEventNotice(event=event),
    )


def turn_stop(call_id: str) -> hs.HookCall:
    return hs.HookCall(
        call_id=call_id, kind=hs.CALL_KIND_SEAM, seam=hs.SEAM_TURN_STOP, turn_stop=hs.TurnStopCall()
    )


async def test_handlers_run_in_place_answer_in_order_each_in_a_context_of_its_own() -> None:
    plugin = sdk.Plugin("inline")
    seen: list[tuple[str, str]] = []

    @plugin.prompt_submit()
    async def guard(call: hs.HookCall) -> Any:
        seen.append((call.call_id, SEEN.get()))  # unset: not the previous call's value
        SEEN.set(call.call_id)
        text = sdk.text_of(call.prompt_submit.content)
        return sdk.block_prompt("no") if text == "block" else None

    @plugin.on_session_event()
    async def record(call: hs.HookCall) -> None:
        seen.append((call.call_id, SEEN.get()))
        SEEN.set(call.call_id)

    @plugin.turn_stop()
    async def waits(call: hs.HookCall) -> None:  # awaits: a task, as before
        await asyncio.sleep(3600)

    assert plugin.registry.subscriptions["prompt_submit"].inline
    assert plugin.registry.subscriptions["session_event"].inline
    assert not plugin.registry.subscriptions["turn_stop"].inline

    async with hook_client(plugin) as stub:
        stream = HandleStream(stub)
        await stream.send(turn_stop("s1"))
        batch = hs.CallBatch(calls=[event_notice("n1"), prompt("c1", "ok"), event_notice("n2")])
        await stream.call.write(hs.HandleRequest(batch=batch))
        await stream.send(prompt("c2", "block"))
        first, second = await stream.result(), await stream.result()
        assert (first.call_id, first.WhichOneof("outcome")) == ("c1", None)
        assert (second.call_id, second.prompt_submit.block.reason) == ("c2", "no")
        # The waiting handler is still a task: a CancelCall ends it, and nothing is sent.
        await stream.cancel("s1")
        await stream.send(prompt("c3", "ok"))
        assert (await stream.result()).call_id == "c3"
        stream.call.cancel()
    assert seen == [("n1", ""), ("c1", ""), ("n2", ""), ("c2", ""), ("c3", "")]


async def test_a_coroutine_begun_in_place_goes_on_in_a_task() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[str] = loop.create_future()
    finished: list[str] = []

    async def work() -> str:
        try:
            return await gate + "!"
        finally:
            finished.append("work")

    coro = work()
    waiting = coro.send(None)  # its first step, run in place: it waits on the gate
    assert waiting is gate

    async def rest() -> str:
        return await resumed(coro, waiting)

    task = asyncio.create_task(rest())
    await asyncio.sleep(0)
    gate.set_result("done")
    assert await task == "done!"
    assert finished == ["work"]

    # A cancel reaches the coroutine, as it would in a task of its own.
    gate = loop.create_future()
    coro = work()
    waiting = coro.send(None)
    task = asyncio.create_task(rest())
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert finished == ["work", "work"]
