"""Lineage: which live agent owns which, so that a child never outlives its owner.

A sub-agent is created with a parent (CreateAgent `parent`, or the `delegate` tool). The
tree lives here, in memory, beside the agent registry; the child's session header
records its parent for readers. Teardown walks it depth first (the factory disposes an
agent's children before the agent), and a cancelled turn reaches the children it made.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentloop.v1 import agent_pb2
from server.kernel.errors import FailedPrecondition, InvalidArgument
from server.kernel.limits import Limits

MAX_TOOL_CALL_ID = 256

LINEAGE_LIMIT = "LINEAGE_LIMIT"
"""The `ErrorInfo.reason` of a child past `maxAgentDepth` or `maxChildrenPerAgent`."""


@dataclass(frozen=True)
class Link:
    """A child's place under its parent."""

    parent: str
    """The owning agent's id."""
    tool_call_id: str
    """The parent's tool call that made the child, when one did."""
    depth: int
    """1 under a top-level agent, 2 under a child, ..."""
    turn: int
    """The parent's turn that made the child (0: none was open), for a cancel to reach."""


class Family:
    """The live ownership tree of one server's agents."""

    def __init__(self) -> None:
        self._links: dict[str, Link] = {}
        self._children: dict[str, list[str]] = {}

    def admit(self, limits: Limits, parent: str, tool_call_id: str, turn: int) -> Link:
        """The link of a new child of the live agent `parent`, within the limits."""
        if len(tool_call_id) > MAX_TOOL_CALL_ID:
            raise InvalidArgument("parent.tool_call_id", f"is over {MAX_TOOL_CALL_ID} characters")
        above = self._links.get(parent)
        depth = (above.depth if above else 0) + 1
        if depth > limits.max_agent_depth:
            raise FailedPrecondition(
                f'agent "{parent}" is at depth {depth - 1}: a child would pass'
                f" {limits.describe('max_agent_depth')}",
                LINEAGE_LIMIT,
                agent_id=parent,
            )
        if len(self._children.get(parent, ())) >= limits.max_children_per_agent:
            raise FailedPrecondition(
                f'agent "{parent}" owns {len(self._children[parent])} live children,'
                f" the limit {limits.describe('max_children_per_agent')}",
                LINEAGE_LIMIT,
                agent_id=parent,
            )
        return Link(parent, tool_call_id, depth, turn)

    def add(self, child: str, link: Link) -> None:
        """Record a published child under its parent."""
        self._links[child] = link
        self._children.setdefault(link.parent, []).append(child)

    def remove(self, agent_id: str) -> None:
        """Forget an agent that left the registry (its children went first)."""
        link = self._links.pop(agent_id, None)
        if link is not None:
            siblings = self._children.get(link.parent, [])
            if agent_id in siblings:
                siblings.remove(agent_id)
            if not siblings:
                self._children.pop(link.parent, None)

    def link(self, agent_id: str) -> Link | None:
        """The agent's place under its parent; None for a top-level agent."""
        return self._links.get(agent_id)

    def children(self, agent_id: str) -> list[str]:
        """The live children of an agent, oldest first."""
        return list(self._children.get(agent_id, ()))

    def started_by(self, agent_id: str, turn: int) -> list[str]:
        """The live children that the agent's turn `turn` made."""
        return [c for c in self.children(agent_id) if self._links[c].turn == turn]

    def descendants(self, agent_id: str) -> list[str]:
        """Every live agent under this one, depth first, children in creation order."""
        found: list[str] = []
        for child in self.children(agent_id):
            found.append(child)
            found.extend(self.descendants(child))
        return found

    def message(self, agent_id: str) -> agent_pb2.Lineage | None:
        """The `Agent.lineage` of an agent: its parent, and its children; None if neither."""
        link = self._links.get(agent_id)
        children = self.children(agent_id)
        if link is None and not children:
            return None
        lineage = agent_pb2.Lineage(child_agent_ids=sorted(children))
        if link is not None:
            lineage.parent_agent_id = link.parent
            lineage.parent_tool_call_id = link.tool_call_id
            lineage.depth = link.depth
        return lineage
