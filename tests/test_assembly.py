"""Tests of the stream-to-message assembler."""

from __future__ import annotations

import pytest

from agentloop.v1 import content_pb2, stream_pb2
from server.kernel.assembly import MessageAssembler
from server.kernel.errors import CodedError

S = stream_pb2


def start(index: int, kind: S.BlockKind.ValueType, call_id: str = "", name: str = ""):
    return S.StreamChunk(
        block_start=S.BlockStart(index=index, kind=kind, tool_call_id=call_id, tool_name=name)
    )


def delta(index: int, text: str):
    return S.StreamChunk(block_delta=S.BlockDelta(index=index, text=text))


def end(index: int):
    return S.StreamChunk(block_end=S.BlockEnd(index=index))


def usage(i: int, o: int):
    return S.StreamChunk(usage=content_pb2.Usage(input_tokens=i, output_tokens=o))


def finish(kind: S.FinishKind.ValueType = S.FINISH_KIND_STOP, message: str = "", code: str = ""):
    return S.StreamChunk(finish=S.Finish(kind=kind, message=message, code=code))


def assemble(*chunks: S.StreamChunk) -> MessageAssembler:
    assembler = MessageAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    return assembler


def test_empty_stream():
    a = MessageAssembler()
    assert a.content == []
    assert a.usage is None
    assert a.finish is None


def test_text_usage_finish():
    a = assemble(
        start(0, S.BLOCK_KIND_TEXT),
        delta(0, "a"),
        delta(0, "b"),
        delta(0, "c"),
        end(0),
        usage(3, 1),
        finish(),
    )
    assert a.content == [content_pb2.ContentBlock(text=content_pb2.TextBlock(text="abc"))]
    assert a.usage == content_pb2.Usage(input_tokens=3, output_tokens=1)
    assert a.finish == S.Finish(kind=S.FINISH_KIND_STOP)


def test_reasoning_text_and_tool_calls_in_index_order():
    a = assemble(
        start(1, S.BLOCK_KIND_TEXT),
        start(0, S.BLOCK_KIND_REASONING),
        delta(0, "think"),
        delta(1, "say"),
        start(2, S.BLOCK_KIND_TOOL_CALL, "c1", "word_count"),
        delta(2, '{"text":'),
        delta(2, '"hi"}'),
        end(2),
        end(1),
        end(0),
        start(3, S.BLOCK_KIND_TOOL_CALL, "c2", "noargs"),
        end(3),
        finish(),
    )
    assert [b.WhichOneof("block") for b in a.content] == [
        "reasoning",
        "text",
        "tool_call",
        "tool_call",
    ]
    assert a.content[0].reasoning.text == "think"
    assert a.content[1].text.text == "say"
    assert a.content[2].tool_call == content_pb2.ToolCallBlock(
        id="c1", name="word_count", arguments='{"text":"hi"}'
    )
    assert a.content[3].tool_call == content_pb2.ToolCallBlock(id="c2", name="noargs")


def test_empty_text_and_reasoning_blocks_are_dropped():
    a = assemble(
        start(0, S.BLOCK_KIND_TEXT),
        end(0),
        start(1, S.BLOCK_KIND_REASONING),
        delta(1, ""),
        end(1),
        start(2, S.BLOCK_KIND_TEXT),
        delta(2, "x"),
        end(2),
    )
    assert a.content == [content_pb2.ContentBlock(text=content_pb2.TextBlock(text="x"))]


def test_open_blocks_are_included_with_what_they_received():
    a = assemble(start(0, S.BLOCK_KIND_TEXT), delta(0, "trunc"))
    assert a.content[0].text.text == "trunc"


def test_latest_usage_wins_and_results_are_copies():
    first, last = usage(1, 1), usage(5, 7)
    a = assemble(first, last)
    assert a.usage == content_pb2.Usage(input_tokens=5, output_tokens=7)
    assert a.usage is not None
    a.usage.input_tokens = 99
    assert last.usage.input_tokens == 5


def test_error_finish_keeps_message_and_code():
    a = assemble(finish(S.FINISH_KIND_ERROR, "boom", "E1"))
    assert a.finish == S.Finish(kind=S.FINISH_KIND_ERROR, message="boom", code="E1")


@pytest.mark.parametrize(
    ("chunks", "match"),
    [
        ([delta(0, "x")], "unknown block 0"),
        ([end(3)], "unknown block 3"),
        ([start(0, S.BLOCK_KIND_TEXT), end(0), delta(0, "x")], "ended block 0"),
        ([start(0, S.BLOCK_KIND_TEXT), end(0), end(0)], "ended block 0"),
        ([start(0, S.BLOCK_KIND_TEXT), start(0, S.BLOCK_KIND_TEXT)], "reopened block 0"),
        ([start(0, S.BLOCK_KIND_UNSPECIFIED)], "without a kind"),
        ([S.StreamChunk()], "empty chunk"),
        ([finish(), usage(1, 1)], "after its finish"),
        ([finish(), finish()], "after its finish"),
    ],
)
def test_protocol_violations(chunks: list[S.StreamChunk], match: str):
    a = MessageAssembler()
    with pytest.raises(CodedError, match=match) as info:
        for chunk in chunks:
            a.add(chunk)
    assert info.value.code == "MODEL_PROTOCOL"
