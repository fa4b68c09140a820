"""`agentloop acp`'s mappings that need no process: prompts in, events out, bad lines."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acp import RequestError, embedded_text_resource, resource_block, resource_link_block
from acp import text_block as acp_text

from agentloop.cli.acp_agent import stop_reason
from agentloop.cli.acp_input import INVALID_REQUEST, PARSE_ERROR, problem
from agentloop.cli.acp_updates import LiveUpdates, prompt_text, replayed
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2 as st


def test_a_prompt_becomes_one_message() -> None:
    blocks = [
        acp_text("look at"),
        resource_link_block("notes.md", "file:///w/notes.md"),
        resource_block(embedded_text_resource("file:///w/a.py", "print(1)")),
    ]
    assert prompt_text(blocks) == (
        'look at\n[notes.md](file:///w/notes.md)\n<context source="file:///w/a.py">\nprint(1)\n</context>'
    )


def chunk(**fields: Any) -> ev.SessionEvent:
    return ev.SessionEvent(assistant_chunk=ev.AssistantChunk(chunk=st.StreamChunk(**fields)))


def test_live_chunks_stream_as_text_and_thoughts() -> None:
    live = LiveUpdates()
    events = [
        ev.SessionEvent(step_start=ev.StepStart(turn=1, step=1)),
        chunk(block_start=st.BlockStart(index=0, kind=st.BLOCK_KIND_REASONING)),
        chunk(block_delta=st.BlockDelta(index=0, text="hmm")),
        chunk(block_start=st.BlockStart(index=1, kind=st.BLOCK_KIND_TEXT)),
        chunk(block_delta=st.BlockDelta(index=1, text="hi")),
        chunk(block_start=st.BlockStart(index=2, kind=st.BLOCK_KIND_TOOL_CALL)),
        chunk(block_delta=st.BlockDelta(index=2, text='{"a"')),
        ev.SessionEvent(tool_call=ev.ToolCall(call_id="c1", name="t", arguments='{"a": 1}')),
    ]
    updates = [u for e in events for u in live.of(e)]
    shown = [
        (u.session_update, getattr(getattr(u, "content", None), "text", None)) for u in updates
    ]
    assert shown == [
        ("agent_thought_chunk", "hmm"),
        ("agent_message_chunk", "hi"),
        ("tool_call", None),
    ]
    assert updates[2].raw_input == {"a": 1} and updates[2].status == "in_progress"


def test_a_stored_result_replays_as_a_finished_call() -> None:
    failed = ev.ToolResult(
        call_id="c1", is_error=True, content=[c.ContentBlock(text=c.TextBlock(text="no"))]
    )
    [update] = replayed(ev.SessionEvent(tool_result=failed))
    assert (update.session_update, update.status, update.raw_output) == (
        "tool_call_update", "failed", {"content": "no", "isError": True},
    )  # fmt: skip
    assert replayed(ev.SessionEvent(step_start=ev.StepStart())) == []


def test_turn_ends_map_to_stop_reasons() -> None:
    def end(**kind: Any) -> ev.SessionEvent:
        return ev.SessionEvent(turn_end=ev.TurnEnd(turn=3, reason=ev.TurnEndReason(**kind)))

    assert stop_reason(end(completed=ev.TurnCompleted())) == "end_turn"
    assert stop_reason(end(aborted=ev.TurnAborted())) == "cancelled"
    assert stop_reason(end(max_tokens=ev.TurnMaxTokens())) == "max_tokens"
    assert stop_reason(end(rejected=ev.TurnRejected(reason="no"))) == "refusal"
    with pytest.raises(RequestError) as failed:
        stop_reason(end(error=ev.TurnError(message="model down", code="MODEL_ERROR")))
    assert failed.value.data == {"turn": 3, "error": "model down", "code": "MODEL_ERROR"}


@pytest.mark.parametrize(
    ("line", "code", "request_id"),
    [
        (b"nope", PARSE_ERROR, None),
        (b"\xff\xfe", PARSE_ERROR, None),
        (b"[]", INVALID_REQUEST, None),
        (b'{"jsonrpc": "2.0", "id": 4, "method": []}', INVALID_REQUEST, 4),
        (b'{"jsonrpc": "2.0", "id": true, "method": 1}', INVALID_REQUEST, None),
        (b'{"jsonrpc": "2.0"}', INVALID_REQUEST, None),
        (b'{"jsonrpc": "2.0", "id": "x"}', INVALID_REQUEST, "x"),
    ],
)
def test_malformed_lines_get_their_json_rpc_error(
    line: bytes, code: int, request_id: object
) -> None:
    reply = problem(line)
    assert reply is not None
    assert (reply["error"]["code"], reply["id"]) == (code, request_id)
    json.dumps(reply)  # it can be sent


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}',
        b'{"jsonrpc": "2.0", "method": "session/cancel", "params": {}}',
        b'{"jsonrpc": "2.0", "id": 2, "result": {}}',
        b'{"jsonrpc": "2.0", "id": 3, "error": {"code": 1, "message": "m"}}',
    ],
)
def test_well_formed_lines_pass(line: bytes) -> None:
    assert problem(line) is None
