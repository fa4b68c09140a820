"""Unit tests of the CLI's pure rendering functions."""

from __future__ import annotations

from typing import Any

from agentloop.cli import render
from agentloop.v1 import (
    agent_event_pb2,
    agent_pb2,
    content_pb2,
    session_event_pb2,
    stream_pb2,
)

E = session_event_pb2


def text(value: str) -> content_pb2.ContentBlock:
    return content_pb2.ContentBlock(text=content_pb2.TextBlock(text=value))


def chunk(seq: int, c: stream_pb2.StreamChunk, step: int = 1, turn: int = 1) -> E.SessionEvent:
    return E.SessionEvent(seq=seq, assistant_chunk=E.AssistantChunk(turn=turn, step=step, chunk=c))


def start(
    index: int, kind: stream_pb2.BlockKind.ValueType, call_id: str = "", name: str = ""
) -> stream_pb2.StreamChunk:
    return stream_pb2.StreamChunk(
        block_start=stream_pb2.BlockStart(
            index=index, kind=kind, tool_call_id=call_id, tool_name=name
        )
    )


def delta(index: int, value: str) -> stream_pb2.StreamChunk:
    return stream_pb2.StreamChunk(block_delta=stream_pb2.BlockDelta(index=index, text=value))


def end(index: int) -> stream_pb2.StreamChunk:
    return stream_pb2.StreamChunk(block_end=stream_pb2.BlockEnd(index=index))


def turn_end(turn: int, **reason: Any) -> E.SessionEvent:
    return E.SessionEvent(turn_end=E.TurnEnd(turn=turn, reason=E.TurnEndReason(**reason)))


def turn_start(turn: int) -> E.SessionEvent:
    return E.SessionEvent(turn_start=E.TurnStart(turn=turn, trigger=E.TRIGGER_KIND_MESSAGE))


def test_turn_end_text_for_every_reason() -> None:
    assert render.turn_end_text(turn_end(3, completed=E.TurnCompleted()).turn_end) == (
        "[turn 3 completed]"
    )
    aborted = turn_end(3, aborted=E.TurnAborted(reason="user interrupt")).turn_end
    assert render.turn_end_text(aborted) == "[turn 3 aborted: user interrupt]"
    error = turn_end(3, error=E.TurnError(step=1, message="boom", code="MODEL_ERROR")).turn_end
    assert render.turn_end_text(error) == "[turn 3 error at step 1: boom (MODEL_ERROR)]"
    assert render.turn_end_text(turn_end(2, max_tokens=E.TurnMaxTokens()).turn_end) == (
        "[turn 2 max tokens]"
    )
    rejected = turn_end(4, rejected=E.TurnRejected(reason="no swearing")).turn_end
    assert render.turn_end_text(rejected) == "[turn 4 rejected: no swearing]"
    assert render.turn_end_text(turn_end(5, disposed=E.TurnDisposed()).turn_end) == (
        "[turn 5 disposed]"
    )


def test_turn_succeeded_only_when_completed_or_truncated() -> None:
    assert render.turn_succeeded(turn_end(1, completed=E.TurnCompleted()).turn_end)
    assert render.turn_succeeded(turn_end(1, max_tokens=E.TurnMaxTokens()).turn_end)
    for reason in (
        {"aborted": E.TurnAborted()},
        {"error": E.TurnError()},
        {"disposed": E.TurnDisposed()},
        {"rejected": E.TurnRejected()},
        {"interrupted": E.TurnInterrupted()},
    ):
        assert not render.turn_succeeded(turn_end(1, **reason).turn_end)


def test_turn_view_renders_text_inline_and_tools_as_lines() -> None:
    view = render.TurnView()
    events = [
        turn_start(1),
        chunk(1, start(0, stream_pb2.BLOCK_KIND_TOOL_CALL, call_id="c1", name="wc")),
        chunk(2, delta(0, '{"text": "a b"}')),  # tool arguments are not echoed inline
        chunk(3, end(0)),
        E.SessionEvent(tool_call=E.ToolCall(call_id="c1", name="wc", arguments='{"text": "a b"}')),
        E.SessionEvent(tool_result=E.ToolResult(call_id="c1", content=[text("2 words")])),
        chunk(6, start(0, stream_pb2.BLOCK_KIND_TEXT), step=2),
        chunk(7, delta(0, "It has "), step=2),
        chunk(8, delta(0, "2 words."), step=2),
        chunk(9, end(0), step=2),
        turn_end(1, completed=E.TurnCompleted()),
    ]
    output = "".join(view.render(e) for e in events) + view.finish()
    assert output == (
        '→ tool wc({"text": "a b"})\n← wc: 2 words\nIt has 2 words.\n[turn 1 completed]\n'
    )


def test_turn_view_marks_tool_errors() -> None:
    view = render.TurnView()
    view.render(E.SessionEvent(tool_call=E.ToolCall(call_id="c1", name="nope", arguments="{}")))
    result = E.ToolResult(
        call_id="c1",
        content=[text("unknown tool")],
        is_error=True,
        error=E.ToolError(name="ToolNotFoundError", code="UNKNOWN_TOOL"),
    )
    rendered = view.render(E.SessionEvent(tool_result=result))
    assert rendered == "← nope ✗ error (UNKNOWN_TOOL): unknown tool\n"


def test_turn_view_reasoning_is_prefixed_or_dimmed() -> None:
    events = [
        chunk(0, start(0, stream_pb2.BLOCK_KIND_REASONING)),
        chunk(1, delta(0, "hmm")),
        chunk(2, end(0)),
        chunk(3, start(1, stream_pb2.BLOCK_KIND_TEXT)),
        chunk(4, delta(1, "Hi")),
    ]
    plain = render.TurnView()
    assert "".join(plain.render(e) for e in events) + plain.finish() == "(thinking) hmm\nHi\n"
    color = render.TurnView(color=True)
    dimmed = "".join(color.render(e) for e in events)
    assert dimmed == f"{render.DIM}(thinking) {render.RESET}{render.DIM}hmm{render.RESET}\nHi"


def test_turn_view_breaks_the_line_before_whole_lines() -> None:
    view = render.TurnView()
    out = view.render(chunk(0, start(0, stream_pb2.BLOCK_KIND_TEXT)))
    out += view.render(chunk(1, delta(0, "partial")))
    blocked = E.SessionEvent(prompt_blocked=E.PromptBlocked(reason="policy"))
    out += view.render(blocked)
    steer = E.SessionEvent(steering_message=E.SteeringMessage(turn=1, content=[text("shorter")]))
    out += view.render(steer)
    assert out == "partial\n⚑ blocked: policy\n↪ steering: shorter\n"
    assert view.finish() == ""


def test_turn_view_shows_deltas_of_blocks_started_before_the_stream() -> None:
    view = render.TurnView()
    assert view.render(chunk(5, delta(0, "tail end"))) == "tail end"


def test_turn_view_says_when_the_message_was_dropped() -> None:
    dropped = E.SessionEvent(seq=7, message_dropped=E.MessageDropped(reason="cancelled"))
    assert render.TurnView().render(dropped) == "⚑ dropped: cancelled\n"


def test_event_line_is_seq_kind_summary() -> None:
    event = turn_start(0)
    event.turn_start.source.kind = "user"
    assert render.event_line(event) == "    0 turn_start        turn 0 (message, user)"
    message = E.SessionEvent(seq=1, user_message=E.UserMessage(content=[text("hello\nthere")]))
    assert render.event_line(message) == "    1 user_message      user: hello⏎there"
    assert render.event_line(chunk(7, delta(0, "Hel"))) == "    7 assistant_chunk   'Hel'"
    finish = chunk(
        8, stream_pb2.StreamChunk(finish=stream_pb2.Finish(kind=stream_pb2.FINISH_KIND_STOP))
    )
    assert render.event_line(finish) == "    8 assistant_chunk   finish stop"
    call = E.SessionEvent(seq=9, tool_call=E.ToolCall(call_id="c1", name="wc", arguments="{}"))
    assert render.event_line(call) == "    9 tool_call         c1 wc({})"
    end_line = turn_end(1, completed=E.TurnCompleted())
    end_line.seq = 23
    assert render.event_line(end_line) == "   23 turn_end          turn 1 completed"


def test_one_line_elides_long_text() -> None:
    assert render.one_line("x" * 200, limit=10) == "x" * 9 + "…"
    assert render.one_line("a\r\nb") == "a⏎b"


def test_agent_event_lines() -> None:
    status = agent_event_pb2.AgentEvent(
        status=agent_event_pb2.AgentStatusChanged(status=agent_event_pb2.AGENT_STATUS_RUNNING)
    )
    assert render.agent_event_line(status).strip() == "· status running"
    queued = agent_event_pb2.AgentEvent(
        queued=agent_event_pb2.AgentQueued(content=[text("hi")], steering=True)
    )
    assert render.agent_event_line(queued).strip() == "· queued user (steering): hi"
    error = agent_event_pb2.AgentEvent(
        error=agent_event_pb2.AgentError(turn=2, step=1, message="boom", code="X")
    )
    assert render.agent_event_line(error).strip() == "· error turn 2 step 1: boom (X)"
    disposed = agent_event_pb2.AgentEvent(disposed=agent_event_pb2.AgentDisposed())
    assert render.agent_event_line(disposed).strip() == "· disposed"


def test_agents_table_aligns_columns() -> None:
    agents = [
        agent_pb2.Agent(
            agent_id="assistant", session_id="s-1", status=agent_event_pb2.AGENT_STATUS_IDLE
        ),
        agent_pb2.Agent(
            agent_id="b", session_id="s-2", status=agent_event_pb2.AGENT_STATUS_RUNNING
        ),
    ]
    assert render.agents_table(agents).splitlines() == [
        "AGENT      STATUS   SESSION",
        "assistant  idle     s-1",
        "b          running  s-2",
    ]


def test_an_enum_value_newer_than_the_client_is_shown_not_fatal() -> None:
    from agentloop.v1 import agent_event_pb2

    status = agent_event_pb2.AgentStatus.ValueType(7)
    assert render.status_word(status) == "unknown(7)"
    assert render.status_word(agent_event_pb2.AGENT_STATUS_IDLE) == "idle"
