"""A session's events are serialized once: the store writes the bytes its streams send."""

from __future__ import annotations

from pathlib import Path

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.sessions import session as session_module
from server.sessions.journal import Journal
from server.sessions.session import SessionLog
from server.stores.sqlite import SqliteStore
from tests.stores import create_session


def chunk(text: str) -> ev.AssistantMessage:
    return ev.AssistantMessage(content=[c.ContentBlock(text=c.TextBlock(text=text))])


async def test_streams_send_the_bytes_the_store_wrote(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "agentloop.db")
    await store.open()
    await create_session(store, "s", session_pb2.SessionHeader())
    log = SessionLog("s", session_pb2.SessionHeader(), Journal(store), window=4)
    for i in range(10):
        log.add(chunk(f"part {i}" + "x" * 5000 * (i == 9)))
    await log.settle()
    events = await log.read(1, 100)
    raw = await log.read_encoded(1, 100, 1 << 20)
    # The same bytes as each event serialized, older events (past the window) included,
    # and as the store holds them.
    assert raw == [e.SerializeToString() for e in events]
    assert [e.SerializeToString() for e in await store.read("s", 1, 11)] == raw
    # The recent ones are one object each, whoever asks: serialized once.
    recent = await log.read_encoded(7, 100, 1 << 20)
    assert all(a is b for a, b in zip(recent[:-1], raw[6:-1], strict=True))
    assert all(log.encoded(e) is r for e, r in zip(events[6:9], raw[6:9], strict=True))
    # Byte-bounded like `read`: at least one event, then within the budget.
    sizes = [len(r) for r in raw]
    assert await log.read_encoded(1, 100, sizes[0] + sizes[1]) == raw[:2]
    assert await log.read_encoded(10, 100, 10) == raw[9:]
    assert await log.read_encoded(7, 100, sizes[6] + sizes[7]) == raw[6:8]  # in the window
    assert await log.read_encoded(7, 2, 1 << 20) == raw[6:8]
    await store.close()


def test_the_kept_bytes_stay_few() -> None:
    log = SessionLog("s", session_pb2.SessionHeader())
    for i in range(10 * session_module.ENCODED_KEPT):
        log.encoded(log.add(chunk(f"part {i}")))
    assert len(log._encoded) <= 2 * session_module.ENCODED_KEPT
    big = log.add(chunk("x" * (session_module.ENCODED_MAX + 1)))
    assert log.encoded(big) == big.SerializeToString()
    assert big.seq not in log._encoded  # a large event is serialized again, not kept twice
