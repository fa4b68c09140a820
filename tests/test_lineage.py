"""The ownership tree alone: links, depth-first order, limits, what `Agent.lineage` shows."""

from __future__ import annotations

import pytest

from server.kernel.errors import FailedPrecondition, InvalidArgument
from server.kernel.limits import Limits
from server.lifecycle.lineage import LINEAGE_LIMIT, Family


def tree() -> Family:
    family = Family()
    limits = Limits()
    for child, parent, turn in (("a", "p", 1), ("a1", "a", 0), ("b", "p", 2), ("a2", "a", 0)):
        family.add(child, family.admit(limits, parent, f"call-{child}", turn))
    return family


def test_descendants_are_depth_first_in_creation_order() -> None:
    family = tree()
    assert family.descendants("p") == ["a", "a1", "a2", "b"]
    assert family.children("a") == ["a1", "a2"]
    assert family.started_by("p", 2) == ["b"]
    link = family.link("a1")
    assert link is not None and (link.parent, link.depth, link.tool_call_id) == ("a", 2, "call-a1")


def test_removal_forgets_the_agent_and_its_place() -> None:
    family = tree()
    family.remove("a1")
    assert family.children("a") == ["a2"] and family.link("a1") is None
    family.remove("a2")
    assert family.children("a") == [] and family.descendants("p") == ["a", "b"]


def test_lineage_message_shows_parent_and_live_children() -> None:
    family = tree()
    message = family.message("a")
    assert message is not None
    assert (message.parent_agent_id, message.parent_tool_call_id, message.depth) == (
        "p",
        "call-a",
        1,
    )
    assert list(message.child_agent_ids) == ["a1", "a2"]
    top = family.message("p")
    assert top is not None and not top.parent_agent_id and list(top.child_agent_ids) == ["a", "b"]
    assert family.message("stranger") is None


def test_limits_name_themselves() -> None:
    family = Family()
    limits = Limits(max_agent_depth=1, max_children_per_agent=1)
    family.add("c", family.admit(limits, "p", "", 0))
    with pytest.raises(FailedPrecondition) as fan_out:
        family.admit(limits, "p", "", 0)
    assert fan_out.value.reason == LINEAGE_LIMIT
    assert "limits.maxChildrenPerAgent (1)" in str(fan_out.value)
    with pytest.raises(FailedPrecondition) as depth:
        family.admit(limits, "c", "", 0)
    assert "limits.maxAgentDepth (1)" in str(depth.value)
    with pytest.raises(InvalidArgument) as long_call:
        family.admit(limits, "q", "x" * 257, 0)
    assert long_call.value.field == "parent.tool_call_id"
