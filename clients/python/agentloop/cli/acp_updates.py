"""Session events as ACP `session/update` notifications (for `agentloop acp`).

Two readings of the same log: `LiveUpdates` follows a running turn (text streams as
the model's chunks arrive), `replayed` reads a stored event (whole messages, the
user's prompts included) for `session/load`. Tool calls map the same way in both:
`tool_call` when a call starts, `tool_call_update` with its result. Live, a call's
progress (the live `tool_progress` agent event) is a `tool_call_update` in progress
whose content is the latest report; the result replaces it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from acp import (
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    StopReason,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import stream_pb2

Update = UserMessageChunk | AgentMessageChunk | AgentThoughtChunk | ToolCallStart | ToolCallProgress
"""The `session/update` payloads the bridge sends."""

STOP_REASONS: dict[str, StopReason] = {
    "completed": "end_turn",
    "max_tokens": "max_tokens",
    "aborted": "cancelled",
    "disposed": "cancelled",
    "interrupted": "cancelled",
    "rejected": "refusal",
}
"""A turn end's reason kind as an ACP stop reason; `error` is a JSON-RPC error instead."""


def arguments(raw: str) -> Any:
    """A call's JSON arguments, parsed when they parse (the raw text otherwise)."""
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return raw


def block_text(blocks: Any) -> str:
    """The text and reasoning of content blocks, joined."""
    parts: list[str] = []
    for block in blocks:
        kind = block.WhichOneof("block")
        if kind == "text":
            parts.append(block.text.text)
        elif kind == "reasoning":
            parts.append(block.reasoning.text)
    return "".join(parts)


def call_started(call: ev.ToolCall) -> ToolCallStart:
    """A tool call that started."""
    return start_tool_call(
        call.call_id,
        call.name,
        kind="other",
        status="in_progress",
        raw_input=arguments(call.arguments),
    )


def call_finished(result: ev.ToolResult) -> ToolCallProgress:
    """A tool call's result: completed, or failed with what the model sees."""
    text = block_text(result.content)
    return update_tool_call(
        result.call_id,
        status="failed" if result.is_error else "completed",
        content=[tool_content(text_block(text))] if text else None,
        raw_output={"content": text, "isError": result.is_error},
    )


def call_progress(progress: ae.ToolProgress) -> ToolCallProgress:
    """A running call's latest progress report, as the call's content for now."""
    done = f"{progress.progress:g}"
    if progress.HasField("total"):
        done += f"/{progress.total:g}"
    return update_tool_call(
        progress.tool_call_id,
        status="in_progress",
        content=[tool_content(text_block(f"{done} {progress.message}".rstrip()))],
    )


def assistant_updates(content: Any) -> list[Update]:
    """A whole assistant message: its reasoning as thoughts, its text as a message."""
    updates: list[Update] = []
    for block in content:
        kind = block.WhichOneof("block")
        if kind == "text" and block.text.text:
            updates.append(update_agent_message_text(block.text.text))
        elif kind == "reasoning" and block.reasoning.text:
            updates.append(update_agent_thought_text(block.reasoning.text))
    return updates


def replayed(event: ev.SessionEvent) -> list[Update]:
    """A stored event as the updates `session/load` replays (none for most kinds)."""
    kind = event.WhichOneof("payload")
    if kind in ("user_message", "steering_message"):
        text = block_text(getattr(event, kind).content)
        return [update_user_message_text(text)] if text else []
    if kind == "assistant_message":
        return assistant_updates(event.assistant_message.content)
    if kind == "tool_call":
        return [call_started(event.tool_call)]
    if kind == "tool_result":
        return [call_finished(event.tool_result)]
    return []


class LiveUpdates:
    """The updates of a running turn: streamed text, thoughts and tool calls."""

    def __init__(self) -> None:
        self._kinds: dict[int, int] = {}
        """The kind of each open block of the current model stream, by index."""
        self._started: set[str] = set()
        self._ended: set[str] = set()
        self._held: dict[str, ae.ToolProgress] = {}
        """The latest progress of calls whose `tool_call` was not read yet."""

    def of(self, event: ev.SessionEvent) -> list[Update]:
        """The updates one event of the turn makes (none for most kinds)."""
        kind = event.WhichOneof("payload")
        if kind == "assistant_chunk":
            return self._chunk(event.assistant_chunk.chunk)
        if kind == "step_start":
            self._kinds.clear()
        if kind == "tool_call":
            self._started.add(event.tool_call.call_id)
            return replayed(event) + self._release()
        if kind == "tool_result":
            self._ended.add(event.tool_result.call_id)
            self._held.pop(event.tool_result.call_id, None)
            return replayed(event)
        return []

    def heard(self, events: Sequence[ae.AgentEvent]) -> list[Update]:
        """The progress updates among live agent events.

        A batch's agent events are heard before its session events are read, so the
        progress of a call not yet announced waits for its `tool_call`; that of a call
        that ended is dropped (its result says the rest).
        """
        for event in events:
            if event.HasField("tool_progress"):
                progress = event.tool_progress
                if progress.tool_call_id not in self._ended:
                    self._held[progress.tool_call_id] = progress
        return self._release()

    def _release(self) -> list[Update]:
        ready = [call_id for call_id in self._held if call_id in self._started]
        return [call_progress(self._held.pop(call_id)) for call_id in ready]

    def _chunk(self, chunk: stream_pb2.StreamChunk) -> list[Update]:
        which = chunk.WhichOneof("chunk")
        if which == "block_start":
            self._kinds[chunk.block_start.index] = chunk.block_start.kind
        elif which == "block_delta" and chunk.block_delta.text:
            kind = self._kinds.get(chunk.block_delta.index, stream_pb2.BLOCK_KIND_TEXT)
            if kind == stream_pb2.BLOCK_KIND_TEXT:
                return [update_agent_message_text(chunk.block_delta.text)]
            if kind == stream_pb2.BLOCK_KIND_REASONING:
                return [update_agent_thought_text(chunk.block_delta.text)]
        return []


def prompt_text(blocks: list[Any]) -> str:
    """An ACP prompt as the text of one message.

    Text as is; an embedded text resource as its text under its URI; a resource link
    as its name and URI (the agent's tools read it); other blocks are refused at
    `initialize` (no image or audio capability).
    """
    parts: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource_link":
            parts.append(f"[{block.name}]({block.uri})")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            if text is not None:
                parts.append(f'<context source="{resource.uri}">\n{text}\n</context>')
    return "\n".join(parts)
