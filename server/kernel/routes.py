"""Which of a seam's listeners one agent's dispatches reach, worked out once per agent.

A listener may be scoped to one agent (`agent_id`), or concern only some agents
(`applies`: a plugin whose conditions name agents or their labels), or only some of the
facets a dispatch names ahead (`wants`: the tools or event kinds its conditions name).
Asking that on every dispatch costs as much as the call it saves, so the registry keeps,
per seam, agent and facet, the `Route`: the listeners that run, in order, and the
listeners that sit out (`Skip`), each counted where the chain would have reached it,
so that a listener its conditions exclude still counts every call it did not get,
exactly as if it had run and declined.

When every listener of an agent wants a known set of facets (`FacetSet`: the event
kinds of its conditions), their union (`wanted`) says ahead which facets reach any
listener: a caller that knows its dispatches name none of them (a run of stored
events of other kinds) dispatches them as `OTHER_FACET`, a route that counts each
skip and reads nothing.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from typing import NamedTuple, Protocol, TypeVar

Skip = tuple[MutableMapping[int, int], int]
"""Where a listener that sits out a dispatch is counted: `counts[key] += 1`."""

AgentFilter = Callable[[str], "bool | None"]
"""Whether a listener concerns an agent's dispatches; None: cannot tell yet (the agent
is not live): it is kept, and asked again at the next dispatch."""

FacetFilter = Callable[[str], bool]
"""Whether a listener concerns a dispatch of one facet: the tool called, the event's kind."""


class FacetSet(frozenset[str]):
    """A `FacetFilter` that is a set of facets: its listener wants these and no other."""

    def __call__(self, facet: str) -> bool:
        """Whether `facet` is one of the set."""
        return facet in self


OTHER_FACET = "\x00other"
"""The facet of a dispatch naming none that a `FacetSet` holds (no event kind is it)."""

NO_SKIPS: tuple[Skip, ...] = ()


class Routed(Protocol):
    """What a route reads of a registration."""

    @property
    def agent_id(self) -> str | None:
        """The one agent the listener is scoped to (None: every agent)."""
        ...

    @property
    def applies(self) -> AgentFilter | None:
        """Which agents' dispatches concern the listener (None: every agent's)."""
        ...

    @property
    def wants(self) -> FacetFilter | None:
        """Which facets' dispatches concern the listener (None: every facet's)."""
        ...

    @property
    def skip(self) -> Skip | None:
        """Where a dispatch it sits out is counted (None: nowhere)."""
        ...


R = TypeVar("R", bound=Routed)


class Route(NamedTuple):
    """One agent's listeners of one seam, and those that sit out its dispatches."""

    listeners: Sequence[Routed]
    skips: tuple[tuple[Skip, ...], ...] | None
    """None: none sits out. Else one entry per listener, those sitting out just before
    it, and a last entry for those after the last listener."""

    def count_all(self) -> None:
        """Count one dispatch skipped by every listener that sits out (none runs first)."""
        if self.skips is not None:
            for before in self.skips:
                for counts, key in before:
                    counts[key] += 1


def route(
    registrations: Sequence[R], agent_id: str | None, facet: str | None = None
) -> tuple[Route, bool]:
    """The route of `agent_id` over a seam's `registrations`, and whether it is settled.

    With a `facet` (the dispatch named it), the listeners that do not want it sit out
    too. A settled route may be kept until the seam's listeners or the agent change.
    """
    kept: list[R] = []
    skips: list[tuple[Skip, ...]] = []
    waiting: list[Skip] = []
    skipping = False
    settled = True
    for reg in registrations:
        if reg.agent_id is not None and reg.agent_id != agent_id:
            continue  # another agent's own listener: not this agent's to count
        wants = reg.wants
        if wants is not None and facet is not None and not wants(facet):
            if reg.skip is not None:
                waiting.append(reg.skip)
                skipping = True
            continue
        applies = reg.applies
        if applies is not None and agent_id is not None:
            verdict = applies(agent_id)
            if verdict is None:
                settled = False  # kept: the listener's own check decides per call
            elif not verdict:
                if reg.skip is not None:
                    waiting.append(reg.skip)
                    skipping = True
                continue
        skips.append(tuple(waiting) if waiting else NO_SKIPS)
        waiting = []
        kept.append(reg)
    skips.append(tuple(waiting) if waiting else NO_SKIPS)
    return Route(kept, tuple(skips) if skipping else None), settled


def wanted(registrations: Sequence[R], agent_id: str | None) -> frozenset[str] | None:
    """The facets some listener of `agent_id` wants: the union of their `FacetSet`s.

    None when a listener wants every facet, or some no set names (a tool-name pattern):
    then any dispatch may reach one. A listener whose agent conditions exclude the agent
    wants nothing of it; one that cannot tell yet (not live) counts with its set.
    """
    facets: set[str] = set()
    for reg in registrations:
        if reg.agent_id is not None and reg.agent_id != agent_id:
            continue
        applies = reg.applies
        if applies is not None and agent_id is not None and applies(agent_id) is False:
            continue
        wants = reg.wants
        if not isinstance(wants, FacetSet):
            return None
        facets |= wants
    return frozenset(facets)
