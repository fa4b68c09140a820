"""Match conditions, compiled once per listener into one predicate over the seam's input.

A subscription's `MatchConditions` (and its `agent_ids`) are checked when the plugin
describes itself (`agentloop.plugin.conditions.invalid_conditions`, the rules the
checker and the SDK share) and compiled here into the predicate the listener runs
before it builds a call: a call it refuses costs no round trip and is counted as
skipped. Each condition kind reads one facet of the input; the seam's codec says how to
read each facet it has (`Facets`). A condition of a facet the seam lacks was refused at
registration.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from agentloop.plugin.conditions import event_kinds, name_matcher, prompt_text
from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.kernel.routes import FacetSet

__all__ = [
    "NO_FACETS", "Facets", "LabelsOf", "agent_filter", "compile_matcher", "facet_filter",
    "no_labels", "prompt_text",
]  # fmt: skip

In = TypeVar("In")

LabelsOf = Callable[[str], Mapping[str, str] | None]
"""The labels of a live agent by id (None for an agent that is not live)."""


def no_labels(agent_id: str) -> Mapping[str, str] | None:
    """The lookup where no agents are kept (tests, benchmarks): no labels."""
    return {}


@dataclass(frozen=True)
class Facets(Generic[In]):
    """How a seam's input shows what conditions look at; None: the seam has no such facet."""

    tool: Callable[[In], str] | None = None
    """The called tool's name."""
    event_kind: Callable[[In], str | None] | None = None
    """The event's payload kind."""
    prompt: Callable[[In], str] | None = None
    """The prompt's text."""


NO_FACETS: Facets[object] = Facets()
"""A seam whose input shows nothing conditions look at."""


def compile_matcher(
    subscription: hk.Subscription, facets: Facets[In], labels_of: LabelsOf
) -> Callable[[In], bool] | None:
    """The predicate a call's input must pass; None when every call matches.

    `agent_ids` and the older `Subscription.event_kinds` are conditions too. The input
    names its agent (`agent_id`). One closure with its checks inline, the agent's first
    (the most selective, usually): it runs on every call of every agent, and a call of
    a function per condition would cost as much as the check.
    """
    conditions = subscription.conditions
    agent_ids = frozenset(subscription.agent_ids) or None
    labels = tuple(sorted(conditions.agent_labels.items())) or None
    tool = facets.tool if conditions.tools else None
    named = name_matcher(conditions.tools) if tool is not None else None
    kinds = event_kinds(subscription) if facets.event_kind is not None else None
    kind = facets.event_kind if kinds is not None else None
    prompt = facets.prompt
    prefix = conditions.prompt_prefix if prompt is not None else ""
    search = re.compile(conditions.prompt_regex).search if conditions.prompt_regex else None
    if prompt is None or not (prefix or search is not None):
        prompt = None
    if agent_ids is None and labels is None and named is None and kind is None and prompt is None:
        return None

    def matches(input: In) -> bool:
        agent_id: str = input.agent_id  # type: ignore[attr-defined]
        if agent_ids is not None and agent_id not in agent_ids:
            return False
        if labels is not None:
            have = labels_of(agent_id)
            if have is None:
                return False  # not live: it has no labels
            for key, value in labels:
                if have.get(key) != value:
                    return False
        if named is not None and not named(tool(input)):  # type: ignore[misc]
            return False
        if kind is not None and kind(input) not in kinds:  # type: ignore[operator]
            return False
        if prompt is not None:
            text = prompt(input)
            if not text.startswith(prefix):
                return False
            if search is not None and search(text) is None:
                return False
        return True

    return matches


def agent_filter(
    subscription: hk.Subscription, labels_of: LabelsOf
) -> Callable[[str], bool | None] | None:
    """Whether the subscription's agent conditions admit an agent; None without any.

    Agent conditions: `agent_ids` and `agent_labels`. The answer holds for the agent's
    life (its labels are fixed at creation), so the seam registry asks once per agent
    and routes its calls past a listener that excludes it: no call, no input built. An
    agent that is not live yet has no answer (None): the listener's matcher decides.
    """
    agent_ids = frozenset(subscription.agent_ids) or None
    labels = tuple(sorted(subscription.conditions.agent_labels.items())) or None
    if agent_ids is None and labels is None:
        return None

    def applies(agent_id: str) -> bool | None:
        if agent_ids is not None and agent_id not in agent_ids:
            return False
        if labels is None:
            return True
        have = labels_of(agent_id)
        if have is None:
            return None
        return all(have.get(key) == value for key, value in labels)

    return applies


def facet_filter(subscription: hk.Subscription, facets: Facets[In]) -> Callable[[str], bool] | None:
    """Whether the tool-name or event-kind conditions admit a facet; None without any.

    The facet is what the loop names before it builds the input (a tool's name, an
    event's kind). The seam registry asks once per agent and facet, and routes the
    dispatches refused past the listener, counted skipped: no input built, no chain
    walked. A dispatch that names no facet still meets the listener's matcher. Event
    kinds are a `FacetSet`: a caller may learn ahead which kinds any listener wants.
    """
    if facets.tool is not None and subscription.conditions.tools:
        return name_matcher(subscription.conditions.tools)
    if facets.event_kind is not None:
        kinds = event_kinds(subscription)
        if kinds is not None:
            return FacetSet(kinds)
    return None
