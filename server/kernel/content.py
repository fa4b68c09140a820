"""Small constructors and views over the contract's content messages."""

from __future__ import annotations

from collections.abc import Iterable

from agentloop.v1 import content_pb2 as c

USER = c.Source(kind="user")
"""The default source of sends, steers and injections."""


def text_block(text: str) -> c.ContentBlock:
    """One text block."""
    return c.ContentBlock(text=c.TextBlock(text=text))


def text_content(text: str) -> list[c.ContentBlock]:
    """Content made of one text block."""
    return [text_block(text)]


def plain_text(content: Iterable[c.ContentBlock]) -> str:
    """The concatenated text blocks of `content`."""
    return "".join(b.text.text for b in content if b.WhichOneof("block") == "text")


def tool_calls_of(content: Iterable[c.ContentBlock]) -> list[c.ToolCallBlock]:
    """The tool-call blocks of `content`, in order."""
    return [b.tool_call for b in content if b.WhichOneof("block") == "tool_call"]


def without_tool_calls(content: Iterable[c.ContentBlock]) -> list[c.ContentBlock]:
    """`content` with its tool-call blocks removed."""
    return [b for b in content if b.WhichOneof("block") != "tool_call"]


def resolve_source(source: c.Source | None) -> c.Source:
    """The source with its default applied: an empty kind means "user"."""
    if source is None or not source.kind:
        return c.Source(kind="user", name=source.name if source is not None else "")
    return source
