"""A plugin's rewriting decision composed with the rest of the chain.

Two seams rewrite content: `agent/prompt-submit` (a `PromptDecision`: allow with new
content, or block) and `tools/post-execute` (a `PostToolDecision`: accept with new
content, or block). Both compose the same way; each names its allowing member.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d


class Allowing(Protocol):
    """The allowing member of a rewriting decision (`PromptAllow`, `ToolAccept`)."""

    @property
    def content(self) -> RepeatedCompositeFieldContainer[c.ContentBlock]:
        """The rewritten content; empty keeps it."""
        ...

    @property
    def additional_contexts(self) -> RepeatedCompositeFieldContainer[d.HookContext]:
        """Context added after it."""
        ...

    def SetInParent(self) -> None:
        """Mark the member set in its decision."""
        ...


Rewrite = TypeVar("Rewrite", d.PromptDecision, d.PostToolDecision)


async def compose(
    mine: Rewrite,
    allowing: Callable[[Rewrite], Allowing],
    content: list[c.ContentBlock],
    rest: Callable[[list[c.ContentBlock]], Awaitable[Rewrite]],
) -> Rewrite:
    """A plugin's rewriting decision composed with the rest of the chain.

    Its block stands; otherwise the rest of the chain sees its rewrite of `content`
    (or `content` unchanged), a block there stands, and else the outcome is the
    innermost rewrite with the contexts of both, the plugin's first. `allowing` reads
    the decision's allowing member (`allow` of a prompt, `accept` of a tool result).
    """
    if mine.HasField("block"):
        return mine
    rewritten = list(allowing(mine).content) or content
    inner: Rewrite = await rest(rewritten)
    if inner.HasField("block"):
        return inner
    composed = type(mine)()
    merged = allowing(composed)
    merged.SetInParent()
    merged.content.extend(list(allowing(inner).content) or rewritten)
    merged.additional_contexts.extend(
        [*allowing(mine).additional_contexts, *allowing(inner).additional_contexts]
    )
    return composed
