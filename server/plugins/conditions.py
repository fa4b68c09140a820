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

__all__ = ["Facets", "LabelsOf", "compile_matcher", "no_labels", "prompt_text"]

In = TypeVar("In")

LabelsOf = Callable[[str], Mapping[str, str]]
"""The labels of a live agent by id (empty for an agent that is not live)."""


def no_labels(agent_id: str) -> Mapping[str, str]:
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


def compile_matcher(
    subscription: hk.Subscription, facets: Facets[In], labels_of: LabelsOf
) -> Callable[[In], bool] | None:
    """The predicate a call's input must pass; None when every call matches.

    `agent_ids` and the older `Subscription.event_kinds` are conditions too. The input
    names its agent (`agent_id`).
    """
    tests: list[Callable[[In], bool]] = []
    agent_ids = frozenset(subscription.agent_ids)
    if agent_ids:
        tests.append(lambda input: input.agent_id in agent_ids)  # type: ignore[attr-defined]
    conditions = subscription.conditions
    labels = tuple(sorted(conditions.agent_labels.items()))
    if labels:

        def labelled(input: In) -> bool:
            have = labels_of(input.agent_id)  # type: ignore[attr-defined]
            return all(have.get(key) == value for key, value in labels)

        tests.append(labelled)
    tool = facets.tool
    if tool is not None and conditions.tools:
        named = name_matcher(conditions.tools)
        tests.append(lambda input: named(tool(input)))
    kind = facets.event_kind
    kinds = event_kinds(subscription)
    if kind is not None and kinds is not None:
        tests.append(lambda input: kind(input) in kinds)
    prompt = facets.prompt
    if prompt is not None and conditions.prompt_prefix:
        prefix = conditions.prompt_prefix
        tests.append(lambda input: prompt(input).startswith(prefix))
    if prompt is not None and conditions.prompt_regex:
        search = re.compile(conditions.prompt_regex).search
        tests.append(lambda input: search(prompt(input)) is not None)
    if not tests:
        return None
    if len(tests) == 1:
        return tests[0]
    return lambda input: all(test(input) for test in tests)
