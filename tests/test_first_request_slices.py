"""A long backlog (an agent's first model request after a resume) is encoded in slices,
the event loop running other tasks between two, and the bytes sent are unchanged.

A probe task beside the request reads, at each of its turns on the loop, how many
history messages the agent's kept encoding holds: counts strictly between nothing and
the whole history are slices it saw between two of the encoding's stretches. A request
cancelled (or aborted) between two slices leaves an exact, shorter encoding: the next
request's bytes are still those of the straightforward encoding.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.abort import AbortController
from server.kernel.content import text_content
from server.kernel.errors import Aborted
from server.lifecycle.factory import AgentFactory
from server.loop.runtime import Runtime
from server.models import ModelRequest
from server.models.appended import SLICE_BYTES, SLICE_MESSAGES
from server.models.openai import OpenAIModel
from server.models.openai_body import ChatHistory, request_bytes, request_bytes_in_slices
from server.models.openai_wire import request_body
from server.plugins.model import EncodedMessages
from server.plugins.wire import call_request, model_stream_request
from server.sessions.session import SessionLog
from server.stores.sqlite import SqliteStore
from tests.fake_openai import FakeOpenAI, Reply, text
from tests.replayed_requests import replayed_requests

OPTIONS = agent_pb2.AgentOptions(provider="fake", model="gpt-test")
BIG = 40_000
"""Characters of each prompt of the resumed conversation: a few messages fill a slice."""


def straightforward(request: ModelRequest, model: str = "gpt-test") -> bytes:
    """The body as the adapter encoded it before it kept anything between requests."""
    return json.dumps(request_body(request, model)).encode()


class Probe:
    """A task that reads `kept()` at each of its turns on the loop, until stopped.

    `then(kept)` runs at each turn too (to cancel something mid-encoding, say).
    """

    def __init__(self, kept: Callable[[], int], then: Callable[[int], None] = lambda _: None):
        self.seen: list[int] = []
        self._kept = kept
        self._then = then
        self._running = True
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self._running:
            kept = self._kept()
            self.seen.append(kept)
            self._then(kept)
            await asyncio.sleep(0)

    async def stop(self) -> list[int]:
        """Stop it; the counts it saw, one per turn."""
        self._running = False
        await self._task
        return self.seen

    def between(self, whole: int) -> list[int]:
        """The counts it saw strictly between nothing and `whole`, each once, in order."""
        return sorted({k for k in self.seen if 0 < k < whole})


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


def prompt(i: int) -> str:
    """A long prompt, different for each turn, with characters JSON escapes."""
    return f"{i}: " + ('ünï "cödé" ✓\n\t' * (BIG // 16))[:BIG]


def kept_of(model: OpenAIModel, agent_id: str) -> Callable[[], int]:
    def kept() -> int:
        history = model._histories.get(agent_id)
        return history.kept if history is not None else 0

    return kept


async def resumed_conversation(
    fake: FakeOpenAI, tmp_path: Path, turns: int, cancel_mid_encoding: bool
) -> tuple[list[ev.SessionEvent], list[int], int]:
    """`turns` turns with long prompts, a resume, then a turn (cancelled mid-encoding of its
    first request, then another turn, if asked).

    Returns the stored events, the kept counts the probe saw during the resumed agent's
    first request, and the history's length at that request.
    """
    fake.script(*(Reply(events=text(f"answer {i}")) for i in range(turns + 2)))
    runtime = Runtime(store=SqliteStore(tmp_path / "agentloop.db"))
    model = OpenAIModel(name="fake", base_url=fake.base_url, default_model="gpt-default")
    runtime.models.register("fake", model)
    factory = AgentFactory(runtime)
    try:
        agent = await factory.create("a1", OPTIONS)
        for i in range(turns):
            agent.send(text_content(prompt(i)))
            await asyncio.wait_for(agent.when_idle(), 10)
        session_id = agent.session.session_id
        await factory.dispose("a1")  # the kept encoding goes with the agent
        agent = await factory.resume("a1", session_id, None)
        whole = 2 * turns + 1  # the history at the resumed agent's first request

        cancelled: list[int] = []

        def cancel_mid_way(kept: int) -> None:
            if cancel_mid_encoding and 0 < kept < whole and not cancelled:
                cancelled.append(kept)
                agent.cancel("mid-encoding")

        probe = Probe(kept_of(model, "a1"), cancel_mid_way)
        agent.send(text_content("still there?"))
        await asyncio.wait_for(agent.when_idle(), 10)
        seen = await probe.stop()
        if cancel_mid_encoding:
            stopped_at = kept_of(model, "a1")()
            assert 0 < stopped_at < whole  # the slices kept so far, no more
            agent.send(text_content("and now?"))
            await asyncio.wait_for(agent.when_idle(), 10)
        events = await agent.session.read(1, 100_000)
    finally:
        await factory.close()
        await model.aclose()
        await runtime.store.close()
    return events, seen, whole


async def test_a_resumed_long_history_is_sent_in_slices_byte_for_byte(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    turns = 12
    events, seen, whole = await resumed_conversation(fake, tmp_path, turns, False)
    requests = replayed_requests(events)
    assert len(requests) == len(fake.requests) == turns + 1
    for request, sent in zip(requests, fake.requests, strict=True):
        assert sent.raw == straightforward(request), (request.turn, request.step)
    assert len(fake.requests[-1].raw) > 3 * SLICE_BYTES
    # The probe ran between the slices of the resumed agent's first request: several.
    between = [k for k in sorted(set(seen)) if 0 < k < whole]
    assert len(between) >= 3, seen


async def test_a_turn_cancelled_mid_encoding_leaves_the_next_request_exact(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    turns = 12
    events, seen, whole = await resumed_conversation(fake, tmp_path, turns, True)
    ends = [e.turn_end for e in events if e.HasField("turn_end")]
    assert [end.reason.WhichOneof("kind") for end in ends[-2:]] == ["aborted", "completed"]
    requests = replayed_requests(events)
    # The cancelled step sent nothing: every other step's request went out, exact.
    assert len(requests) == turns + 2
    assert len(fake.requests) == turns + 1
    sent_requests = [*requests[:turns], requests[-1]]
    for request, sent in zip(sent_requests, fake.requests, strict=True):
        assert sent.raw == straightforward(request), (request.turn, request.step)
    assert [k for k in set(seen) if 0 < k < whole]  # it was cancelled mid-way


# -- in process: slices by count and by bytes, cancels, aborts, two requests at once --------


def long_log(messages: int, size: int = 10) -> SessionLog:
    """A detached session of `messages` history messages (alternating user/assistant)."""
    log = SessionLog("s", session_pb2.SessionHeader())
    for i in range(messages):
        said = text_content(f"{i} " + "é" * size)
        if i % 2:
            log.add(ev.AssistantMessage(content=said, provenance=c.Provenance(provider="p")))
        else:
            log.add(ev.UserMessage(content=said))
    return log


def request_of(messages: Sequence[c.Message], system: str = "You are a test.") -> ModelRequest:
    header = c.RequestHeader(config=c.ModelConfig(provider="p", model="m"), system=system)
    return ModelRequest("a", "s", 1, 1, header, messages, agent_pb2.AgentOptions())


async def test_a_long_backlog_is_encoded_a_slice_of_messages_at_a_time() -> None:
    log = long_log(4 * SLICE_MESSAGES + 10)
    history = ChatHistory()
    request = request_of(log.history())
    probe = Probe(lambda: history.kept)
    body = await request_bytes_in_slices(request, "m", "auto", history, AbortController().signal)
    await probe.stop()
    assert body == straightforward(request, "m")
    assert probe.between(len(log.history())) == [SLICE_MESSAGES * k for k in (1, 2, 3, 4)]
    # The next request adds two messages: one slice, no yield, the same bytes.
    log.add(ev.AssistantMessage(content=text_content("x"), provenance=c.Provenance()))
    log.add(ev.UserMessage(content=text_content("y")))
    request = request_of(log.history())
    probe = Probe(lambda: history.kept)
    body = await request_bytes_in_slices(request, "m", "auto", history, AbortController().signal)
    await probe.stop()
    assert body == straightforward(request, "m")
    assert probe.between(len(log.history())) == []


async def test_large_messages_end_a_slice_before_its_count() -> None:
    # 0.3 of a slice's bytes each ("é" is two bytes): the fourth reaches the slice's bytes.
    log = long_log(14, size=int(SLICE_BYTES * 0.15))
    history = ChatHistory()
    request = request_of(log.history())
    probe = Probe(lambda: history.kept)
    body = await request_bytes_in_slices(request, "m", "auto", history, AbortController().signal)
    await probe.stop()
    assert body == straightforward(request, "m")
    assert probe.between(14) == [4, 8, 12]


async def test_a_cancel_or_an_abort_between_slices_keeps_an_exact_shorter_encoding() -> None:
    log = long_log(5 * SLICE_MESSAGES)
    whole = len(log.history())
    for stop in ("cancel", "abort"):
        history = ChatHistory()
        request = request_of(log.history())
        controller = AbortController()
        task = asyncio.create_task(
            request_bytes_in_slices(request, "m", "auto", history, controller.signal)
        )

        def stop_at_two_slices(kept: int) -> None:
            if kept != 2 * SLICE_MESSAGES or task.done():  # noqa: B023
                return
            if stop == "cancel":  # noqa: B023
                task.cancel()  # noqa: B023
            else:
                controller.abort("test")  # noqa: B023

        probe = Probe(lambda: history.kept, stop_at_two_slices)  # noqa: B023
        with pytest.raises(asyncio.CancelledError if stop == "cancel" else Aborted):
            await task
        await probe.stop()
        assert history.kept == 2 * SLICE_MESSAGES
        # The next request goes on from there, in slices or at once: the same bytes.
        assert request_bytes(request_of(log.history()), "m", "auto", history) == straightforward(
            request, "m"
        )
        assert history.kept == whole


async def test_two_requests_of_one_agent_on_other_lists_both_end_exact() -> None:
    """A compaction's list and the old one, encoded at once into one kept history: the
    second to resume sees the other's encoding and encodes its rest at once."""
    old = long_log(4 * SLICE_MESSAGES)
    new = long_log(3 * SLICE_MESSAGES)
    history = ChatHistory()
    first, second = request_of(old.history()), request_of(new.history(), "other system")
    signal = AbortController().signal
    bodies = await asyncio.gather(
        request_bytes_in_slices(first, "m", "auto", history, signal),
        request_bytes_in_slices(second, "m", "auto", history, signal),
    )
    assert list(bodies) == [straightforward(first, "m"), straightforward(second, "m")]
    again = await request_bytes_in_slices(first, "m", "auto", history, signal)
    assert again == straightforward(first, "m")


# -- a plugin model's call -----------------------------------------------------------------


def hook_call(messages: Sequence[c.Message] = ()) -> hk.HookCall:
    header = c.RequestHeader(config=c.ModelConfig(provider="p", model="m"), system="S")
    return hk.HookCall(
        call_id="m1",
        kind=hk.CALL_KIND_MODEL_STREAM,
        agent_id="a",
        turn=1,
        step=1,
        model_stream=hk.ModelStreamCall(provider="p", header=header, messages=messages),
    )


def whole_call(messages: Sequence[c.Message]) -> bytes:
    return call_request(hook_call(messages).SerializeToString())


async def test_a_plugin_call_of_a_resumed_long_history_is_framed_in_slices() -> None:
    live = long_log(4 * SLICE_MESSAGES + 3)
    big = text_content("ü" * int(SLICE_BYTES * 0.15))  # 0.3 of a slice's bytes ("ü": two)
    for _ in range(7):
        live.add(ev.UserMessage(content=big))
    resumed = SessionLog("s", session_pb2.SessionHeader(), seed=live.events)  # a new list
    messages = resumed.history()
    assert list(messages) == list(live.history())
    kept = EncodedMessages()
    probe = Probe(lambda: kept.kept)
    entries = await kept.entries_in_slices(messages, AbortController().signal)
    await probe.stop()
    assert model_stream_request(hook_call(), entries) == whole_call(messages)
    # Four slices of small messages; then the last three small ones and four large ones
    # (the fourth reaches a slice's bytes); then the last three large ones.
    counts = [SLICE_MESSAGES * k for k in (1, 2, 3, 4)] + [4 * SLICE_MESSAGES + 3 + 4]
    assert probe.between(len(messages)) == counts


async def test_a_plugin_call_cancelled_between_slices_leaves_the_next_call_exact() -> None:
    log = long_log(3 * SLICE_MESSAGES)
    kept = EncodedMessages()
    task = asyncio.create_task(kept.entries_in_slices(log.history(), AbortController().signal))

    def cancel_after_one(count: int) -> None:
        if count == SLICE_MESSAGES and not task.done():
            task.cancel()

    probe = Probe(lambda: kept.kept, cancel_after_one)
    with pytest.raises(asyncio.CancelledError):
        await task
    await probe.stop()
    assert kept.kept == SLICE_MESSAGES
    log.add(ev.UserMessage(content=text_content("one more")))
    messages = log.history()
    entries = await kept.entries_in_slices(messages, AbortController().signal)
    assert model_stream_request(hook_call(), entries) == whole_call(messages)
    assert kept.kept == len(messages)
