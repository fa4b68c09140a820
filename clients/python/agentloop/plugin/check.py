r"""A conformance checker for plugins in any language: run it against a running plugin.

    python -m agentloop.plugin.check HOST:PORT [--token TOKEN] [--timeout SECONDS]

It calls `Describe` (as the server does: protocol version 1, the default message size
limit, the offered capabilities) and checks the description; then it opens `Handle`
and sends one representative call for each subscribed seam, one `tool_execute` per
tool, one `model_stream` per model provider and one notification per observer, all
at once (a correct plugin answers them concurrently); to a plugin that lists the
`call_batch` capability, the same calls again in one `CallBatch`; for each subscription
with match conditions, its representative call made to match them, and a call they
exclude, which must be answered "continue unchanged" (the server never sends it: a
plugin deciding on it acts outside what it declared); then a call withdrawn at once
with `CancelCall`, and a call whose 1 ms deadline passes (the server cancels it
then too). Calls carry the spec's numbers (step 0 for the seams called outside a
step); the calls of an `observe_only` subscription are notifications, which must go
unanswered. After each of those the stream must still serve. Each check prints PASS or
FAIL with the reason; the exit code is 1 if any failed, 2 if the plugin is unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from agentloop.plugin.check_calls import (
    Report,
    check_description,
    check_result,
    excluded,
    fitted,
    sample_call,
)
from agentloop.plugin.seam_table import BY_SEAM
from agentloop.plugin.transport import MAX_MESSAGE_BYTES
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.plugin.v1 import hook_service_pb2_grpc as rpc

if TYPE_CHECKING:
    from agentloop.plugin.v1.hook_service_pb2_grpc import HookServiceAsyncStub

CAPABILITIES = (
    "model_stream", "tool_execute", "event_kinds", "buffer_size", "call_batch", "observe_only",
    "match_conditions",
)  # fmt: skip
"""Everything the server offers, so that every capability a plugin lists is exercised."""
BATCH = "call_batch"
"""The capability that lets the server write several calls in one message."""
QUIET = 0.5
"""Seconds a notification, a cancelled call or a late call is given to (wrongly) answer."""


class Session:
    """One `Handle` stream: sends calls, routes each answer to its call id."""

    def __init__(self, stub: HookServiceAsyncStub, metadata: tuple[tuple[str, str], ...]) -> None:
        self.stream = stub.Handle(metadata=metadata)
        self.answers: dict[str, asyncio.Queue[hs.HandleResponse]] = {}
        self.strays: list[str] = []
        self.withdrawn: set[str] = set()
        """Calls cancelled: an answer to them is allowed (the server ignores it)."""
        self.broken = ""
        self._writing = asyncio.Lock()
        """gRPC allows one write in flight per stream."""
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.stream:
                if not isinstance(response, hs.HandleResponse):
                    self.broken = "a message that does not decode as a HandleResponse"
                    return
                kind = response.WhichOneof("kind")
                call_id = response.chunk.call_id if kind == "chunk" else response.result.call_id
                if kind is None:
                    self.broken = "a HandleResponse with no kind set"
                    return
                queue = self.answers.get(call_id)
                if call_id in self.withdrawn:
                    continue
                if queue is None:
                    self.strays.append(call_id)
                else:
                    queue.put_nowait(response)
        except grpc.aio.AioRpcError as error:
            self.broken = f"the stream failed: {error.code().name}: {error.details()}"

    async def send(self, call: hs.HookCall) -> asyncio.Queue[hs.HandleResponse]:
        """Send a call; its answers arrive on the returned queue."""
        (queue,) = await self.send_batch([call], batched=False)
        return queue

    async def send_batch(
        self, calls: list[hs.HookCall], *, batched: bool = True
    ) -> list[asyncio.Queue[hs.HandleResponse]]:
        """Send calls in one `CallBatch` (or one call alone); a queue of answers for each."""
        queues: list[asyncio.Queue[hs.HandleResponse]] = []
        for call in calls:
            queues.append(asyncio.Queue())
            self.answers[call.call_id] = queues[-1]
        request = (
            hs.HandleRequest(batch=hs.CallBatch(calls=calls))
            if batched
            else hs.HandleRequest(call=calls[0])
        )
        await self._write(request)
        return queues

    async def cancel(self, call_id: str, reason: str) -> None:
        """Withdraw a call, as the server does on a cancelled turn or a deadline."""
        await self._write(hs.HandleRequest(cancel=hs.CancelCall(call_id=call_id, reason=reason)))

    async def _write(self, request: hs.HandleRequest) -> None:
        """Write one message; a stream the plugin ended is recorded, not raised."""
        async with self._writing:
            try:
                await self.stream.write(request)
            except (asyncio.InvalidStateError, grpc.aio.AioRpcError) as error:
                self.broken = self.broken or f"the plugin ended the stream ({error})"

    async def close(self) -> None:
        """End the stream."""
        self.stream.cancel()
        self.reader.cancel()


async def answer_of(
    queue: asyncio.Queue[hs.HandleResponse], seconds: float, streaming: bool
) -> list[hs.HandleResponse]:
    """The answer to one call: one result, or (model_stream) chunks up to a finish or result."""
    got: list[hs.HandleResponse] = []
    async with asyncio.timeout(seconds):
        while True:
            response = await queue.get()
            got.append(response)
            if response.WhichOneof("kind") == "result":
                return got
            if not streaming or response.chunk.chunk.HasField("finish"):
                return got


async def run_call(
    session: Session,
    report: Report,
    label: str,
    call: hs.HookCall,
    seconds: float,
    *,
    answered_only: bool = False,
) -> None:
    """Send `call`, check what comes back (only that something does, if `answered_only`)."""
    queue = await session.send(call)
    if session.broken:
        report.fail(label, f"the call could not be sent: {session.broken}")
        return
    await judge(report, label, call, queue, seconds, answered_only=answered_only)


async def judge(
    report: Report,
    label: str,
    call: hs.HookCall,
    queue: asyncio.Queue[hs.HandleResponse],
    seconds: float,
    *,
    answered_only: bool = False,
) -> None:
    """Check what comes back for `call` (a notification: that nothing does)."""
    payload = call.WhichOneof("payload") or ""
    notification = call.kind == hs.CALL_KIND_NOTIFICATION
    try:
        got = await answer_of(queue, QUIET if notification else seconds, payload == "model_stream")
    except TimeoutError:
        if notification:
            report.ok(label, "no answer, as a notification wants")
        else:
            report.fail(label, f"no answer within its deadline ({seconds:g} s)")
        return
    if notification:
        report.fail(label, "a notification was answered (it must not be)")
        return
    report.record(label, [] if answered_only else check_result(call, got))


async def check(address: str, token: str, seconds: float) -> Report:
    """Every check against the plugin at `address`."""
    report = Report()
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub: HookServiceAsyncStub = rpc.HookServiceStub(channel)
        request = hs.DescribeRequest(
            protocol_version=1, max_message_bytes=MAX_MESSAGE_BYTES, capabilities=CAPABILITIES
        )
        try:
            description = await stub.Describe(request, timeout=seconds, metadata=metadata)
        except grpc.aio.AioRpcError as error:
            report.unreachable = f"Describe failed: {error.code().name}: {error.details()}"
            return report
        report.record("describe", check_description(description, CAPABILITIES))
        session = Session(stub, metadata)
        try:
            await conversation(session, report, description, seconds)
        finally:
            await session.close()
    return report


def representative_calls(
    description: hs.DescribeResponse, prefix: str, seconds: float
) -> list[tuple[str, hs.HookCall, float]]:
    """(label, call, deadline) for each subscribed seam, tool and model provider."""
    calls = []
    for index, subscription in enumerate(description.subscriptions):
        spec = BY_SEAM.get(subscription.seam)
        if spec is None:
            continue
        timeout = seconds
        if subscription.HasField("timeout"):
            timeout = subscription.timeout.ToNanoseconds() / 1e9
        sampled = sample_call(
            f"{prefix}k{index}", spec.payload, observe_only=subscription.observe_only
        )
        call = fitted(sampled, subscription)
        if call is not None:  # else its conditions exclude every sample (a prompt regex)
            calls.append((spec.payload, call, timeout))
    for index, tool in enumerate(description.tools):
        call = sample_call(f"{prefix}t{index}", "tool_execute", tool=tool.name)
        calls.append((f"tool {tool.name}", call, seconds))
    for index, model in enumerate(description.models):
        call = sample_call(f"{prefix}m{index}", "model_stream", provider=model.provider)
        calls.append((f"model {model.provider}", call, seconds))
    return calls


async def conversation(
    session: Session, report: Report, description: hs.DescribeResponse, seconds: float
) -> None:
    """The calls, all at once, then in one batch; a cancel, a missed deadline, a probe.

    The batch goes only to a plugin that lists `call_batch`.
    """
    calls = representative_calls(description, "", seconds)
    await asyncio.gather(*(run_call(session, report, *each) for each in calls))
    if BATCH in description.capabilities:
        batch = representative_calls(description, "b", seconds)
        if batch:
            queues = await session.send_batch([call for _, call, _ in batch])
            await asyncio.gather(*(
                judge(report, f"{BATCH}: {label}", call, queue, timeout)
                for (label, call, timeout), queue in zip(batch, queues, strict=True)
            ))  # fmt: skip
    await outside_conditions(session, report, description, seconds)
    probe = next((s for s in description.subscriptions if s.seam in BY_SEAM
                  and BY_SEAM[s.seam].decision is not None and not s.observe_only),
                 None)  # fmt: skip
    if probe is not None:
        await withdrawn(session, report, sample(BY_SEAM[probe.seam].payload), seconds)
    elif description.tools:
        await withdrawn(session, report, sample("tool_execute", tool=description.tools[0].name),
                        seconds)  # fmt: skip
    elif description.models:
        stream = sample("model_stream", provider=description.models[0].provider)
        await withdrawn(session, report, stream, seconds)
    twice = [call_id for call_id, queue in session.answers.items() if not queue.empty()]
    if twice:
        report.fail("call ids", f"answered more than once: {sorted(twice)}")
    if session.strays:
        report.fail("call ids", f"answers for calls never sent: {session.strays}")
    if session.broken:
        report.fail("stream", session.broken)


async def outside_conditions(
    session: Session, report: Report, description: hs.DescribeResponse, seconds: float
) -> None:
    """Per subscription with conditions, a call they exclude: answered "continue unchanged".

    The server never sends it; a plugin that decides on it anyway acts on calls its
    conditions say it does not want, and those decisions would never happen.
    """
    for index, subscription in enumerate(description.subscriptions):
        spec = BY_SEAM.get(subscription.seam)
        if spec is None or subscription.observe_only or not subscription.HasField("conditions"):
            continue  # an observe-only call is never answered: nothing to decide outside
        label = f"conditions: {spec.payload}"
        if fitted(sample_call(f"f{index}", spec.payload), subscription) is None:
            report.ok(label, "no sample matches them (a prompt regex): its sample was not sent")
        call = excluded(sample_call(f"u{index}", spec.payload), subscription)
        if call is None:
            continue
        queue = await session.send(call)
        try:
            (answer,) = await answer_of(queue, seconds, streaming=False)
        except TimeoutError:
            report.fail(label, f"a call outside its conditions got no answer within {seconds:g} s")
            continue
        outcome = answer.result.WhichOneof("outcome")
        if outcome is None:
            report.ok(label, 'a call outside them is answered "continue unchanged"')
        else:
            report.fail(
                label,
                f"answered {outcome} to a call its conditions exclude (the server never sends"
                " it: those decisions would never happen)",
            )


def sample(payload: str, *, tool: str = "", provider: str = "") -> Callable[[str], hs.HookCall]:
    """Sample calls of one kind, by call id."""
    return lambda call_id: sample_call(call_id, payload, tool=tool, provider=provider)


async def withdrawn(
    session: Session, report: Report, make: Callable[[str], hs.HookCall], seconds: float
) -> None:
    """A call cancelled at once, then one past its deadline: the stream must go on serving."""
    # Answers after a cancel are ignored by the server: allowed, not needed.
    session.withdrawn.update(("x-cancel", "x-late"))
    cancelled = make("x-cancel")
    await session.send(cancelled)
    await session.cancel(cancelled.call_id, "the turn was cancelled")
    late = make("x-late")
    late.timeout.FromNanoseconds(1_000_000)
    await session.send(late)
    await asyncio.sleep(0.001)
    await session.cancel(late.call_id, "deadline exceeded")
    await asyncio.sleep(QUIET)
    after = make("x-after")
    label = "a cancel and a missed deadline, then a call: it is answered"
    await run_call(session, report, label, after, seconds, answered_only=True)


def main(argv: list[str] | None = None) -> int:
    """Run the checks, print the report; the exit code says how it went."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port of the plugin")
    parser.add_argument("--token", default="", help="bearer token the plugin requires")
    parser.add_argument("--timeout", type=float, default=5.0, help="default deadline, seconds")
    args = parser.parse_args(argv)
    report = asyncio.run(check(args.address, args.token, args.timeout))
    print(report.render())
    if report.unreachable:
        return 2
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
