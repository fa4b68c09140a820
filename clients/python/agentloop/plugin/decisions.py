"""Small constructors for the decisions a plugin's handlers return, and content helpers.

Every constructor returns the protobuf message of the seam it decides, so a handler can
build its answer in one expression (`return block_prompt("no")`). Returning `None` from a
handler always means "continue unchanged". Wherever content is accepted, a plain `str`
stands for one text block, and wherever contexts are accepted, a `str` stands for
`context(text)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeAlias

from google.protobuf import struct_pb2

from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import approval_pb2 as ap
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from agentloop.v1 import session_event_pb2 as ev

Content: TypeAlias = str | Sequence[c.ContentBlock]
"""Message content: a text, or content blocks."""

ContextLike: TypeAlias = str | d.HookContext
"""A context: a text (kind "plugin"), or a full `HookContext`."""

SourceLike: TypeAlias = str | c.Source
"""A source: a kind such as "plugin", or a full `Source`."""


def text_block(text: str) -> c.ContentBlock:
    """One text content block."""
    return c.ContentBlock(text=c.TextBlock(text=text))


def blocks(content: Content | None) -> list[c.ContentBlock]:
    """`content` as a list of blocks; `None` and "" give no blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [text_block(content)] if content else []
    return list(content)


def text_of(content: Iterable[c.ContentBlock]) -> str:
    """The text of the text blocks of `content`, joined with no separator."""
    return "".join(block.text.text for block in content if block.WhichOneof("block") == "text")


def as_source(value: SourceLike) -> c.Source:
    """`value` as a `Source` (a string is the kind)."""
    return c.Source(kind=value) if isinstance(value, str) else value


def context(
    text: Content,
    source: SourceLike = "plugin",
    *,
    raw: bool = False,
    meta: dict[str, object] | None = None,
) -> d.HookContext:
    """A context message: wrapped as `<context source=...>` unless `raw`."""
    hook_context = d.HookContext(
        content=blocks(text),
        source=as_source(source),
        envelope=ev.CONTEXT_ENVELOPE_RAW if raw else ev.CONTEXT_ENVELOPE_CONTEXT,
    )
    if meta:
        hook_context.meta.CopyFrom(struct(meta))
    return hook_context


def contexts_of(items: Iterable[ContextLike]) -> list[d.HookContext]:
    """Each item as a `HookContext` (a string becomes `context(item)`)."""
    return [context(item) if isinstance(item, str) else item for item in items]


# agent/prompt-submit


def allow_prompt(
    content: Content | None = None, contexts: Iterable[ContextLike] = ()
) -> d.PromptDecision:
    """Allow the prompt, replaced by `content` when given, followed by `contexts`."""
    return d.PromptDecision(
        allow=d.PromptAllow(content=blocks(content), additional_contexts=contexts_of(contexts))
    )


def block_prompt(reason: str) -> d.PromptDecision:
    """Block the prompt; it is logged as `prompt_blocked` with `reason`."""
    return d.PromptDecision(block=d.PromptBlock(reason=reason))


# agent/session-prefix, agent/pre-step, agent/request, agent/step-result


def replace_prefix(messages: Iterable[c.Message]) -> hs.SessionPrefixResult:
    """Replace the session prefix (by convention: your messages, then the one received)."""
    return hs.SessionPrefixResult(prefix=list(messages))


def add_context(text: ContextLike, source: SourceLike = "plugin") -> hs.PreStepResult:
    """Add one context before the step (a `HookContext` is used as it is)."""
    hook_context = context(text, source) if isinstance(text, str) else text
    return hs.PreStepResult(contexts=[hook_context])


def add_contexts(contexts: Iterable[ContextLike]) -> hs.PreStepResult:
    """Add several contexts before the step."""
    return hs.PreStepResult(contexts=contexts_of(contexts))


def replace_config(
    base: c.ModelConfig | None = None,
    *,
    provider: str | None = None,
    model: str | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    stop: Sequence[str] | None = None,
) -> hs.RequestResult:
    """Replace the model configuration: a copy of `base` with the given fields changed."""
    config = c.ModelConfig()
    if base is not None:
        config.CopyFrom(base)
    if provider is not None:
        config.provider = provider
    if model is not None:
        config.model = model
    if temperature is not None:
        config.temperature = temperature
    if max_tokens is not None:
        config.max_tokens = max_tokens
    if stop is not None:
        config.ClearField("stop")
        config.stop.extend(stop)
    return hs.RequestResult(config=config)


def replace_message(message: c.Message | Content) -> hs.StepResultResult:
    """Replace the step's assistant message (content alone makes an assistant message)."""
    if not isinstance(message, c.Message):
        message = c.Message(role=c.ROLE_ASSISTANT, content=blocks(message))
    return hs.StepResultResult(message=message)


# agent/turn-continuation, agent/turn-stop


def continue_turn(
    reason: Content | None = None, source: SourceLike | None = None
) -> d.ContinuationDecision:
    """Run another step; `reason`, when given, is recorded as steering at its top."""
    decision = d.ContinuationContinue(reason=blocks(reason))
    if source is not None:
        decision.source.CopyFrom(as_source(source))
    return d.ContinuationDecision(continue_turn=decision)


def stop_turn() -> d.ContinuationDecision:
    """End the turn (unless steering is pending)."""
    return d.ContinuationDecision(stop=d.ContinuationStop())


def terminal_stop() -> hs.TurnStopResult:
    """Make the turn's stop terminal: pending and late steering are discarded."""
    return hs.TurnStopResult(stop=True)


# tools/pre-execute, tools/post-execute


def allow_tool() -> d.PreToolDecision:
    """Run the tool call."""
    return d.PreToolDecision(allow=d.ToolAllow())


def deny(reason: str) -> d.PreToolDecision:
    """Refuse the tool call; the model sees `Error: <reason>`."""
    return d.PreToolDecision(deny=d.ToolDeny(reason=reason))


def ask(reason: str) -> d.PreToolDecision:
    """Ask for approval of the tool call: it waits for ResolveApproval or an approver."""
    return d.PreToolDecision(ask=d.ToolAsk(reason=reason))


def approve_once() -> hs.ToolApprovalResult:
    """Approver: allow the pending tool call once."""
    return hs.ToolApprovalResult(decision=ap.APPROVAL_DECISION_ALLOW_ONCE)


def reject_tool(reason: str = "") -> hs.ToolApprovalResult:
    """Approver: reject the pending tool call (the model sees the reason after the rejection)."""
    return hs.ToolApprovalResult(decision=ap.APPROVAL_DECISION_REJECT, reason=reason)


def accept(
    content: Content | None = None, contexts: Iterable[ContextLike] = ()
) -> d.PostToolDecision:
    """Keep the tool result, its content replaced by `content` when given."""
    return d.PostToolDecision(
        accept=d.ToolAccept(content=blocks(content), additional_contexts=contexts_of(contexts))
    )


def block_result(feedback: str, contexts: Iterable[ContextLike] = ()) -> d.PostToolDecision:
    """Replace the tool result with `feedback`, marked as an error."""
    return d.PostToolDecision(
        block=d.ToolBlock(feedback=feedback, additional_contexts=contexts_of(contexts))
    )


# Plugin tools


def tool_output(
    content: Content,
    *,
    meta: dict[str, object] | None = None,
    contexts: Iterable[ContextLike] = (),
) -> hs.ToolOutput:
    """A successful tool result, with optional `meta` (kept, never shown to the model)."""
    output = hs.ToolOutput(content=blocks(content), additional_contexts=contexts_of(contexts))
    if meta:
        output.meta.CopyFrom(struct(meta))
    return output


def tool_error(message: str, code: str = "", name: str = "PluginToolError") -> hs.ToolOutput:
    """A failed tool result the model sees as `Error: <message>`."""
    error = ev.ToolError(name=name, code=code) if code else None
    return hs.ToolOutput(content=[text_block(f"Error: {message}")], is_error=True, error=error)


def struct(value: dict[str, object]) -> struct_pb2.Struct:
    """A JSON object as a protobuf `Struct`."""
    result = struct_pb2.Struct()
    result.update(value)  # type: ignore[arg-type]  # the stubs want a narrower value type
    return result
