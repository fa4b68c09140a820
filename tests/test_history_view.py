"""A step's history snapshot is a view, not a copy: it must still behave as the copy did."""

from __future__ import annotations

import pytest

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2
from server.kernel.content import plain_text, text_content
from server.kernel.history import MessageView
from server.sessions.session import SessionLog
from tests.harness import Harness, text_step, tool_step


def user(text: str) -> ev.UserMessage:
    return ev.UserMessage(content=text_content(text))


def texts(messages: object) -> list[str]:
    return [plain_text(m.content) for m in messages]  # type: ignore[attr-defined]


def detached(*said: str) -> SessionLog:
    log = SessionLog("s", session_pb2.SessionHeader())
    for text in said:
        log.add(user(text))
    return log


def test_a_snapshot_does_not_see_later_appends() -> None:
    log = detached("one", "two")
    snapshot = log.history()
    log.add(user("three"))
    assert texts(snapshot) == ["one", "two"]
    assert len(snapshot) == 2 and snapshot == log.derive_messages()[:2]
    assert texts(log.history()) == ["one", "two", "three"]


def test_a_snapshot_keeps_its_messages_across_a_replacement() -> None:
    log = detached("one", "two", "three")
    snapshot = log.history()
    compacted = ev.SessionEvent(seq=log.count, user_message=user("summary"))
    compacted.surface_op.CopyFrom(ev.SurfaceOp(kind=ev.SURFACE_OP_KIND_REPLACE, start=0, end=1))
    log.projection.apply(compacted)  # a stored compaction, as a resume replays it
    assert texts(log.derive_messages()) == ["summary", "three"]
    assert texts(snapshot) == ["one", "two", "three"]


def test_a_view_reads_like_the_list_it_replaces() -> None:
    prefix = [c.Message(role=c.ROLE_USER, content=text_content("P"))]
    log = detached("a", "b", "c")
    view = log.history().behind(prefix)
    as_list = [*prefix, *log.derive_messages()]
    assert view == as_list and as_list == list(view)
    assert len(view) == 4
    assert [view[i] for i in range(-4, 4)] == as_list + as_list
    assert view[1:] == as_list[1:] and view[::-2] == as_list[::-2] and view[5:] == []
    assert isinstance(view[1:], list)
    assert list(reversed(view)) == as_list[::-1]
    assert view.index(as_list[2]) == 2 and as_list[3] in view
    with pytest.raises(IndexError):
        view[4]
    with pytest.raises(IndexError):
        view[-5]
    assert view != as_list[:3] and view != "abcd"
    assert repr(view).startswith("MessageView([")


def test_a_view_cannot_change_the_history() -> None:
    log = detached("a", "b")
    view = log.history()
    for name in ("append", "extend", "insert", "pop", "remove", "clear", "__setitem__"):
        assert not hasattr(view, name), name
    with pytest.raises(TypeError):
        hash(view)
    assert texts(log.derive_messages()) == ["a", "b"]
    assert isinstance(view, MessageView)


async def test_each_request_keeps_the_history_of_its_own_step(harness: Harness) -> None:
    agent = await harness.create(
        script=[tool_step(("word_count", '{"text": "a b"}')), text_step("two words")],
        tools=["word_count"],
    )
    await harness.turn(agent, "count")
    await harness.turn(agent, "again")
    first, second, third = harness.model.requests[:3]
    # Later steps appended to the same history list: the earlier requests do not see it.
    assert [m.role for m in first.messages] == [c.ROLE_USER]
    assert [m.role for m in second.messages] == [c.ROLE_USER, c.ROLE_ASSISTANT, c.ROLE_USER]
    history = agent.session.derive_messages()  # turn 2 went on after its first request
    assert len(history) > len(third.messages) == 5
    assert list(third.messages) == history[:5] and texts(third.messages)[-1] == "again"
