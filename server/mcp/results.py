"""An MCP tool result as the content blocks the model sees, and what is kept beside them.

Text stays text. An image, audio or binary resource becomes a line saying what it is,
its bytes kept (base64, as the server sent them) in the result's meta under `mcp`, with
the structured content: nothing is lost, and the model's context holds no base64. The
text is bounded by the server's `maxResultChars`, with a note saying what was cut.
`isError` stays `is_error`.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_types import CallToolResult

from server.kernel.content import text_block
from server.kernel.tools import ToolReturn

KEPT = ("image", "audio", "resource")
"""Content kinds whose payload goes to meta rather than to the model."""


def describe(item: Any) -> str:
    """One content item as the text the model sees."""
    kind = item.type
    if kind == "text":
        return str(item.text)
    if kind in ("image", "audio"):
        size = len(item.data.rstrip("=")) * 3 // 4  # base64: 4 characters carry 3 bytes
        return f"[{kind} {item.mime_type}, {size} bytes; kept in the call's meta]"
    if kind == "resource_link":
        return f"[resource {item.name}]({item.uri})"
    if kind == "resource":
        resource = item.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return f"[resource {resource.uri}]\n{text}"
        return (
            f"[resource {resource.uri}, {resource.mime_type or 'binary'}; kept in the call's meta]"
        )
    return f"[{kind} content; kept in the call's meta]"


def bounded(texts: list[str], limit: int) -> list[str]:
    """`texts` cut to `limit` characters in all, the last one ending with a note."""
    total = sum(len(t) for t in texts)
    if total <= limit:
        return texts
    out: list[str] = []
    left = limit
    for text in texts:
        if left <= 0:
            break
        out.append(text[:left])
        left -= len(out[-1])
    note = f"\n[truncated: {limit} of {total} characters shown; the result was over the limit]"
    out[-1] += note
    return out


def tool_return(result: CallToolResult, server: str, tool: str, limit: int) -> ToolReturn:
    """The `ToolReturn` of one MCP call."""
    texts = [describe(item) for item in result.content]
    if not texts and result.structured_content is not None:
        texts = [json.dumps(result.structured_content, sort_keys=True)]
    kept = [
        item.model_dump(mode="json", by_alias=True, exclude_none=True)
        for item in result.content
        if item.type in KEPT
    ]
    meta: dict[str, object] = {"server": server, "tool": tool}
    if kept:
        meta["content"] = kept
    if result.structured_content is not None:
        meta["structuredContent"] = result.structured_content
    blocks = [text_block(t) for t in bounded(texts, limit)] or [text_block("")]
    return ToolReturn(content=blocks, is_error=result.is_error, meta={"mcp": meta})


def failed(text: str) -> ToolReturn:
    """A call that did not reach a result: an error the model reads."""
    return ToolReturn(content=[text_block(f"Error: {text}")], is_error=True)
