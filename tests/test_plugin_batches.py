"""Call batches: a plugin that asks for them gets notifications made close together in
one `CallBatch` message (with the next call, if one comes first), every one of them, in
order; one that does not gets them one by one as before; the Python helper takes
batches apart.

The plugin here is a raw grpc.aio `HookService` on a real port, recording each message
as it arrived; the server is a real `App` with the scripted model.
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
from agentloop.v1 import agent_pb2, scripted_pb2
from agentloop.v1 import content_pb2 as c
from server.edge.app import App
from server.models.scripted_options import script_options
from server.plugins import notice_queue
from server.plugins.registry import Overrides
from server.plugins.wire import BATCH_CAPABILITY
from server.settings.config import Config
from tests.plugin_client import HandleStream, hook_client

T = 5.0
"""A hang guard, never a measured time."""

PROMPT = [c.ContentBlock(text=c.TextBlock(text="hello"))]


class Recorder(hk_rpc.HookServiceServicer):
    """Observes every session event; records each `HandleRequest` as it arrived."""

    def __init__(
        self,
        wants_batches: bool,
        seams: tuple[hk.Seam.ValueType, ...] = (),
        answers: bool = True,
        timeout: float = 0.0,
    ) -> None:
        self.wants_batches = wants_batches
        self.seams = seams
        self.answers = answers
        self.timeout = timeout
        """Seams subscribed to besides the session events, answered "continue"."""
        self.offered: list[str] = []
        self.requests: list[hk.HandleRequest] = []
        self.arrived = asyncio.Event()

    async def Describe(self, request: hk.DescribeRequest, context: Any) -> hk.DescribeResponse:
        self.offered = list(request.capabilities)
        wanted = [BATCH_CAPABILITY] if self.wants_batches else []
        return hk.DescribeResponse(
            name="recorder",
            subscriptions=[
                self.subscription(seam) for seam in (*self.seams, hk.SEAM_SESSION_EVENTS)
            ],
            capabilities=[name for name in wanted if name in request.capabilities],
        )

    def subscription(self, seam: hk.Seam.ValueType) -> hk.Subscription:
        subscription = hk.Subscription(seam=seam, failure_policy=hk.FAILURE_POLICY_FAIL_OPEN)
        if self.timeout:
            subscription.timeout.FromNanoseconds(int(self.timeout * 1e9))
        return subscription

    async def Handle(
        self, requests: AsyncIterator[hk.HandleRequest], context: Any
    ) -> AsyncIterator[hk.HandleResponse]:
        async for request in requests:
            self.requests.append(request)
            self.arrived.set()
            kind = request.WhichOneof("kind")
            calls = [request.call] if kind == "call" else list(request.batch.calls)
            for call in calls:
                if self.answers and call.kind != hk.CALL_KIND_NOTIFICATION:  # "continue"
                    yield hk.HandleResponse(result=hk.HookResult(call_id=call.call_id))

    def notifications(self) -> list[hk.HookCall]:
        """Every notification received, batches taken apart, in arrival order."""
        calls: list[hk.HookCall] = []
        for request in self.requests:
            kind = request.WhichOneof("kind")
            if kind == "call":
                calls.append(request.call)
            elif kind == "batch":
                calls.extend(request.batch.calls)
        return [call for call in calls if call.kind == hk.CALL_KIND_NOTIFICATION]

    def batches(self) -> list[int]:
        """The size of each batch received."""
        return [len(r.batch.calls) for r in self.requests if r.WhichOneof("kind") == "batch"]


async def serve(servicer: hk_rpc.HookServiceServicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    hk_rpc.add_HookServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def one_turn(
    recorder: Recorder, wait_for_all: bool = True, turns: int = 1
) -> tuple[int, list[int]]:
    """Register the recorder, run turns of many chunks: (dropped, the event seqs)."""
    server, address = await serve(recorder)
    app = App(Config(listen="127.0.0.1:0", store="memory"))
    await app.start()
    try:
        await app.plugins.register(address, Overrides())
        step = scripted_pb2.ScriptedStep(text="many small chunks", chunk_size=1)
        options = agent_pb2.AgentOptions(
            provider="scripted", model="m", provider_options=script_options([step] * turns)
        )
        agent = await app.factory.create("a", options)
        for _ in range(turns):
            agent.send(PROMPT)
            await agent.when_idle()
        seqs = [event.seq for event in agent.session.events]
        async with asyncio.timeout(T):
            while wait_for_all and len(recorder.notifications()) < len(seqs):
                recorder.arrived.clear()
                await recorder.arrived.wait()
        return app.plugins.plugins["recorder"].stats.dropped, seqs
    finally:
        await app.stop(grace=1)
        await server.stop(None)


async def test_a_plugin_that_asks_gets_every_notification_in_order_in_batches() -> None:
    recorder = Recorder(wants_batches=True)
    dropped, seqs = await one_turn(recorder)
    assert BATCH_CAPABILITY in recorder.offered
    notes = recorder.notifications()
    assert [n.session_event.event.seq for n in notes] == seqs  # all, in order, once
    assert {n.kind for n in notes} == {hk.CALL_KIND_NOTIFICATION}
    assert all(n.session_event.dropped == 0 for n in notes)
    # The chunks of one model call are published together: they travel together.
    assert max(recorder.batches()) > 1
    assert len(recorder.requests) < len(notes)
    assert dropped == 0


async def test_a_plugin_that_does_not_ask_gets_each_notification_alone() -> None:
    recorder = Recorder(wants_batches=False)
    _, seqs = await one_turn(recorder)
    assert recorder.batches() == []
    assert [n.session_event.event.seq for n in recorder.notifications()] == seqs


async def test_a_call_carries_the_notifications_waiting_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The writer would hold notifications for a minute: the next call takes them, the
    # second turn's prompt-submit (the events of a turn are stored by its end).
    monkeypatch.setattr(notice_queue, "GATHER_SECONDS", 60.0)
    recorder = Recorder(wants_batches=True, seams=(hk.SEAM_PROMPT_SUBMIT,))
    _, seqs = await one_turn(recorder, wait_for_all=False, turns=2)
    carrier = next(
        r
        for r in recorder.requests
        if r.batch.calls[-1:] and r.batch.calls[-1].kind == hk.CALL_KIND_SEAM
    )
    *notes, call = carrier.batch.calls
    assert call.kind == hk.CALL_KIND_SEAM and call.call_id
    assert notes and {n.kind for n in notes} == {hk.CALL_KIND_NOTIFICATION}
    received = [n.session_event.event.seq for n in recorder.notifications()]
    assert received == seqs[: len(received)]  # in order, none skipped


async def test_a_cancel_is_not_held_back_while_notifications_gather(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Notifications would gather for a minute; the call that times out (after 0.1 s, a
    # fail-open skip) must still see its CancelCall sent at once, not a minute later.
    monkeypatch.setattr(notice_queue, "GATHER_SECONDS", 60.0)
    recorder = Recorder(
        wants_batches=True, seams=(hk.SEAM_PROMPT_SUBMIT,), answers=False, timeout=0.1
    )
    await one_turn(recorder, wait_for_all=False, turns=2)
    async with asyncio.timeout(T):
        while not any(r.WhichOneof("kind") == "cancel" for r in recorder.requests):
            recorder.arrived.clear()
            await recorder.arrived.wait()
    cancels = [r.cancel for r in recorder.requests if r.WhichOneof("kind") == "cancel"]
    assert cancels[0].reason == "deadline exceeded"


async def test_a_notification_too_big_to_send_is_dropped_alone_and_counted() -> None:
    recorder = Recorder(wants_batches=True)
    # The prompt's user_message event is over the limit; every other event fits.
    big = [c.ContentBlock(text=c.TextBlock(text="x" * 3000))]
    server, address = await serve(recorder)
    app = App(Config(listen="127.0.0.1:0", store="memory", plugin_max_message_bytes=2000))
    await app.start()
    try:
        await app.plugins.register(address, Overrides())
        step = scripted_pb2.ScriptedStep(text="small", chunk_size=1)
        options = agent_pb2.AgentOptions(
            provider="scripted", model="m", provider_options=script_options([step])
        )
        agent = await app.factory.create("a", options)
        agent.send(big)
        await agent.when_idle()
        events = list(agent.session.events)
        stats = app.plugins.plugins["recorder"].stats
        async with asyncio.timeout(T):
            while len(recorder.notifications()) < len(events) - 1:
                recorder.arrived.clear()
                await recorder.arrived.wait()
    finally:
        await app.stop(grace=1)
        await server.stop(None)
    notes = recorder.notifications()
    user = next(e.seq for e in events if e.WhichOneof("payload") == "user_message")
    assert [n.session_event.event.seq for n in notes] == [e.seq for e in events if e.seq != user]
    assert (stats.dropped, stats.oversized) == (1, 1)
    # A later notification queued carries the count, once (none may be queued yet).
    assert sum(n.session_event.dropped for n in notes) <= 1


class Observer:
    """An SDK plugin observing session events; records what its handler got."""

    def __init__(self) -> None:
        self.plugin = sdk.Plugin("observer")
        self.seen: list[int] = []
        self.all_seen = asyncio.Event()

        @self.plugin.on_session_event()
        async def observe(call: hk.HookCall) -> None:
            self.seen.append(call.session_event.event.seq)
            if len(self.seen) == 5:
                self.all_seen.set()

        @self.plugin.turn_stop()
        async def stop(call: hk.HookCall) -> hk.TurnStopResult:
            return sdk.terminal_stop()


@pytest.mark.parametrize("offered", [True, False])
async def test_the_python_helper_asks_for_batches_only_when_offered(offered: bool) -> None:
    observer = Observer()
    request = hk.DescribeRequest(capabilities=[BATCH_CAPABILITY] if offered else [])
    async with hook_client(observer.plugin) as stub:
        description = await stub.Describe(request, timeout=T)
    assert (BATCH_CAPABILITY in description.capabilities) is offered


async def test_the_python_helper_handles_each_call_of_a_batch_in_order() -> None:
    observer = Observer()

    def note(seq: int) -> hk.HookCall:
        notice = hk.SessionEventNotice()
        notice.event.seq = seq
        return hk.HookCall(
            call_id=f"n{seq}",
            kind=hk.CALL_KIND_NOTIFICATION,
            seam=hk.SEAM_SESSION_EVENTS,
            session_event=notice,
        )

    async with hook_client(observer.plugin) as stub:
        stream = HandleStream(stub)
        await stream.call.write(
            hk.HandleRequest(batch=hk.CallBatch(calls=[note(1), note(2), note(3)]))
        )
        await stream.call.write(hk.HandleRequest(call=note(4)))  # the single form still works
        stop = hk.HookCall(call_id="s", kind=hk.CALL_KIND_SEAM, seam=hk.SEAM_TURN_STOP)
        stop.turn_stop.SetInParent()
        await stream.call.write(hk.HandleRequest(batch=hk.CallBatch(calls=[note(5), stop])))
        result = await stream.result()  # a call in a batch is answered like any other
        assert result.call_id == "s" and result.turn_stop.stop
        async with asyncio.timeout(T):
            await observer.all_seen.wait()
        assert await stream.finish() == []  # notifications get no answer
    assert observer.seen == [1, 2, 3, 4, 5]
