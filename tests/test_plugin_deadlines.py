"""Call deadlines, one heap and one timer for every call in flight, on both ends.

The server's connection: each call still ends at its own deadline (in deadline order,
whatever the order the calls were made in), withdrawn with a `CancelCall`; a call
answered in time is not touched by the others' deadlines; an abort fails only its
call. The plugin there is a raw grpc.aio `HookService` on a real port that answers
only the calls it is told to. The Python helper: each call's handler is cancelled at
its own deadline and not answered; the others are answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agentloop.plugin import sdk
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.plugin.v1 import hook_service_pb2_grpc as hk_rpc
from agentloop.v1 import content_pb2 as c
from server.kernel.abort import NEVER, AbortController
from server.kernel.errors import Aborted
from server.plugins.calls import PluginCallFailed, PluginStats
from server.plugins.connection import PluginConnection
from tests.plugin_client import HandleStream, hook_client

T = 5.0
"""A hang guard, never a measured time."""


class Selective(hk_rpc.HookServiceServicer):
    """Answers the calls whose id starts with "answer"; records every cancel."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.cancel_seen = asyncio.Event()

    async def Describe(self, request: hk.DescribeRequest, context: Any) -> hk.DescribeResponse:
        return hk.DescribeResponse(name="selective")

    async def Handle(
        self, requests: AsyncIterator[hk.HandleRequest], context: Any
    ) -> AsyncIterator[hk.HandleResponse]:
        async for request in requests:
            if request.HasField("cancel"):
                self.cancelled.append(request.cancel.call_id)
                self.cancel_seen.set()
            elif request.call.call_id.startswith("answer"):
                yield hk.HandleResponse(result=hk.HookResult(call_id=request.call.call_id))


def stop_call(call_id: str) -> hk.HookCall:
    call = hk.HookCall(call_id=call_id, kind=hk.CALL_KIND_SEAM, seam=hk.SEAM_TURN_STOP)
    call.turn_stop.SetInParent()
    return call


@pytest.fixture
async def plugin() -> AsyncIterator[tuple[Selective, PluginConnection]]:
    servicer = Selective()
    server = grpc.aio.server()
    hk_rpc.add_HookServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    connection = PluginConnection(f"127.0.0.1:{port}", "", PluginStats())
    connection.start()
    assert await connection.wait_ready(T)
    try:
        yield servicer, connection
    finally:
        await connection.close()
        await server.stop(None)


async def outcome(connection: PluginConnection, call_id: str, seconds: float) -> str:
    try:
        await connection.call(stop_call(call_id), seconds, NEVER)
    except PluginCallFailed as failure:
        return f"{failure.kind}: {failure}"
    return "answered"


async def test_each_call_ends_at_its_own_deadline(
    plugin: tuple[Selective, PluginConnection],
) -> None:
    servicer, connection = plugin
    async with asyncio.timeout(T):
        ended: list[str] = []

        async def track(call_id: str, seconds: float) -> str:
            result = await outcome(connection, call_id, seconds)
            ended.append(call_id)
            return result

        results = await asyncio.gather(
            track("late", 0.3),  # made first, ends last: not the head of the timer
            track("early", 0.05),
            track("answer", T),
        )
        assert list(results) == [
            "timeout: no answer within 0.3 s",
            "timeout: no answer within 0.05 s",
            "answered",
        ]
        assert ended.index("early") < ended.index("late")
        while len(servicer.cancelled) < 2:
            servicer.cancel_seen.clear()
            await servicer.cancel_seen.wait()
    assert servicer.cancelled == ["early", "late"]  # withdrawn, in deadline order
    assert connection.stats.timeouts == 2 and connection.stats.calls == 3
    # Ended calls leave nothing behind that could fire later.
    assert await outcome(connection, "answer-again", T) == "answered"


async def test_an_abort_fails_only_its_call(plugin: tuple[Selective, PluginConnection]) -> None:
    servicer, connection = plugin
    controller = AbortController()
    waiting = asyncio.create_task(connection.call(stop_call("aborted"), T, controller.signal))
    other = asyncio.create_task(outcome(connection, "answer", T))
    async with asyncio.timeout(T):
        assert await other == "answered"
        controller.abort("the turn was cancelled")
        with pytest.raises(Aborted, match="the turn was cancelled"):
            await waiting
        await servicer.cancel_seen.wait()
    assert servicer.cancelled == ["aborted"] and connection.stats.timeouts == 0


async def test_the_python_helper_cancels_each_call_at_its_own_deadline() -> None:
    plugin = sdk.Plugin("deadlines")
    cancelled: list[str] = []
    two_cancelled = asyncio.Event()

    @plugin.prompt_submit()
    async def prompt(call: hk.HookCall) -> None:
        if sdk.text_of(call.prompt_submit.content) == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(call.call_id)
                if len(cancelled) == 2:
                    two_cancelled.set()
                raise
        return None

    def prompt_call(call_id: str, text: str, seconds: float) -> hk.HookCall:
        call = hk.HookCall(call_id=call_id, kind=hk.CALL_KIND_SEAM, seam=hk.SEAM_PROMPT_SUBMIT)
        call.prompt_submit.content.append(c.ContentBlock(text=c.TextBlock(text=text)))
        call.timeout.FromNanoseconds(int(seconds * 1e9))
        return call

    async with hook_client(plugin) as stub:
        stream = HandleStream(stub)
        await stream.send(
            prompt_call("late", "hang", 0.3),  # first made, last to expire
            prompt_call("early", "hang", 0.05),
            prompt_call("answered", "hello", T),
        )
        assert await stream.result() == hk.HookResult(call_id="answered")
        async with asyncio.timeout(T):
            await two_cancelled.wait()
        assert await stream.finish() == []  # calls past their deadline are not answered
    assert cancelled == ["early", "late"]
