"""Listeners that concern only some agents are routed past the others' dispatches, once
per agent, and every dispatch they sit out is counted where the chain would have reached
them: a chain that stops before them does not count them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable

from server.kernel import seams as S
from server.kernel.routes import OTHER_FACET, FacetSet
from server.kernel.seams import Next, SeamRegistry

WATERFALL: S.Waterfall[str, str] = S.Waterfall("test/waterfall")
SERIAL: S.Serial[str, str] = S.Serial("test/serial")
EMIT: S.Emit[str] = S.Emit("test/emit")


class Asked:
    """An agent filter admitting `agents`, that counts its questions; None for "later"."""

    def __init__(self, *agents: str, unknown: str = "") -> None:
        self.agents = set(agents)
        self.unknown = unknown
        self.questions = 0

    def __call__(self, agent_id: str) -> bool | None:
        self.questions += 1
        return None if agent_id == self.unknown else agent_id in self.agents


def passing(i: str, nxt: Next[str, str]) -> Awaitable[str]:
    return nxt()


async def test_an_excluded_agent_builds_no_input_and_each_dispatch_is_counted() -> None:
    seams, skipped = SeamRegistry(), defaultdict[int, int](int)
    asked = Asked("red")
    seams.on(WATERFALL, lambda i, nxt: "red's", applies=asked, skip=(skipped, 1))
    seams.on(SERIAL, lambda i: "red's", applies=asked, skip=(skipped, 2))
    seams.on(EMIT, lambda i: None, applies=asked, skip=(skipped, 3))

    def build() -> str:
        raise AssertionError("no input for an agent no listener concerns")

    for _ in range(3):
        assert await seams.waterfall(WATERFALL, "blue", build, "default") == "default"
        assert await seams.serial(SERIAL, "blue", build) is None
        assert not seams.has(EMIT, "blue")  # asked in place of the dispatch: counted
    seams.emit(EMIT, "blue", "event")
    assert dict(skipped) == {1: 3, 2: 3, 3: 4}
    assert asked.questions == 3  # once per seam for "blue", then its route is kept
    assert await seams.waterfall(WATERFALL, "red", lambda: "in", "default") == "red's"
    assert await seams.serial(SERIAL, "red", lambda: "in") == "red's"
    assert seams.has(EMIT, "red")
    assert dict(skipped) == {1: 3, 2: 3, 3: 4}


async def test_a_skip_is_counted_only_where_the_chain_reaches() -> None:
    seams, skipped = SeamRegistry(), defaultdict[int, int](int)
    nobody = Asked()
    seams.on(WATERFALL, lambda i, nxt: "answered", order=1)  # answers: the chain ends here
    seams.on(WATERFALL, passing, order=2, applies=nobody, skip=(skipped, 1))
    seams.on(WATERFALL, passing, order=0, applies=nobody, skip=(skipped, 0))
    assert await seams.waterfall(WATERFALL, "a", lambda: "in", "default") == "answered"
    assert dict(skipped) == {0: 1}
    seams.on(SERIAL, lambda i: None, order=1)
    seams.on(SERIAL, lambda i: "bail", order=2)
    seams.on(SERIAL, lambda i: None, order=3, applies=nobody, skip=(skipped, 3))
    seams.on(SERIAL, lambda i: None, order=0, applies=nobody, skip=(skipped, 2))
    assert await seams.serial(SERIAL, "a", lambda: "in") == "bail"
    assert dict(skipped) == {0: 1, 2: 1}


async def test_an_agent_not_live_yet_is_asked_again_and_a_change_drops_the_routes() -> None:
    seams, skipped = SeamRegistry(), defaultdict[int, int](int)
    asked = Asked("red", unknown="new")
    seams.on(SERIAL, lambda i: f"saw {i}", applies=asked, skip=(skipped, 1))
    assert await seams.serial(SERIAL, "new", lambda: "x") == "saw x"  # kept: it decides
    assert await seams.serial(SERIAL, "new", lambda: "x") == "saw x"
    assert asked.questions == 2
    assert await seams.serial(SERIAL, "blue", lambda: "x") is None
    assert await seams.serial(SERIAL, "blue", lambda: "x") is None
    assert asked.questions == 3
    dispose = seams.on(SERIAL, lambda i: "everyone's", order=5)
    assert await seams.serial(SERIAL, "blue", lambda: "x") == "everyone's"
    assert asked.questions == 4  # the seam changed: the route was worked out again
    dispose()
    seams.remove_agent("blue")
    assert await seams.serial(SERIAL, "blue", lambda: "x") is None
    assert asked.questions == 5  # the agent went: its routes with it
    assert dict(skipped) == {1: 4}


def test_a_seam_is_heard_while_it_has_a_listener_of_any_kind() -> None:
    seams, skipped = SeamRegistry(), defaultdict[int, int](int)
    assert EMIT not in seams.heard
    plain = seams.on(EMIT, lambda i: None)
    assert EMIT in seams.heard
    routed = seams.on(EMIT, lambda i: None, applies=Asked("red"), skip=(skipped, 1))
    plain()
    assert EMIT in seams.heard  # a listener concerning only some agents is heard too
    routed()
    assert EMIT not in seams.heard


def test_a_run_of_emits_is_one_route_and_counts_each_input() -> None:
    """`emit_each`: each input is a dispatch (skips counted per input), each listener sees
    the whole run in order, in one call when it has an `each` form; a failing listener is
    contained and the others still see the run."""
    seams, skipped = SeamRegistry(), defaultdict[int, int](int)
    asked = Asked("red")
    seen: list[str] = []
    runs: list[list[str]] = []

    def fails(i: str) -> None:
        raise RuntimeError("contained")

    seams.on(EMIT, lambda i: seen.append(f"one {i}"), order=0)
    seams.on(EMIT, fails, order=1, each=lambda run: fails(run[0]))
    seams.on(EMIT, lambda i: None, order=2, each=lambda run: runs.append(list(run)))
    seams.on(EMIT, lambda i: None, order=3, applies=asked, skip=(skipped, 7))
    seams.emit_each(EMIT, "blue", ["a", "b", "c"])
    assert seen == ["one a", "one b", "one c"]
    assert runs == [["a", "b", "c"]]
    assert dict(skipped) == {7: 3}  # three dispatches sat out, as three `emit`s count
    assert seams.contained_failures == 1
    assert asked.questions == 1  # the route of "blue", once for the run
    seams.emit_each(EMIT, "red", ["d"])
    assert dict(skipped) == {7: 3} and runs[-1] == ["d"]


async def test_a_facet_a_listener_does_not_want_builds_no_input_and_is_counted() -> None:
    """A dispatch that names its facet (a tool's name, an event's kind) routes past the
    listeners whose `wants` refuse it, asked once per agent and facet; one that names
    none reaches them (their own checks decide)."""
    seams, skipped = SeamRegistry(), defaultdict[int, int](int)
    asked: list[str] = []

    def wants(facet: str) -> bool:
        asked.append(facet)
        return facet == "grep"

    seams.on(WATERFALL, lambda i, nxt: f"saw {i}", wants=wants, skip=(skipped, 1))
    seams.on(EMIT, lambda i: None, wants=wants, skip=(skipped, 2))

    def build() -> str:
        raise AssertionError("no input for a facet no listener wants")

    for _ in range(3):
        assert await seams.waterfall(WATERFALL, "a", build, "default", "shell") == "default"
        assert not seams.has(EMIT, "a", "shell")
    seams.emit(EMIT, "a", "event", "shell")
    assert dict(skipped) == {1: 3, 2: 4}
    assert asked == ["shell", "shell"]  # once per seam, agent and facet: then kept
    assert await seams.waterfall(WATERFALL, "a", lambda: "in", "default", "grep") == "saw in"
    assert await seams.waterfall(WATERFALL, "a", lambda: "in", "default") == "saw in"
    assert seams.has(EMIT, "a", "grep") and seams.has(EMIT, "a")
    assert dict(skipped) == {1: 3, 2: 4}


def test_the_facets_wanted_are_the_union_of_the_agents_listeners_sets() -> None:
    """`wanted`: what a dispatch must name to reach a listener of the agent; `OTHER_FACET`
    reaches none of them, and `has` counts each of its dispatches skipped."""
    seams, skipped = SeamRegistry(), defaultdict[int, int](int)
    assert seams.wanted(EMIT, "red") == frozenset()
    seams.on(EMIT, lambda i: None, wants=FacetSet({"a"}), skip=(skipped, 1))
    seams.on(EMIT, lambda i: None, wants=FacetSet({"b"}), agent_id="red", skip=(skipped, 2))
    blue_only = seams.on(
        EMIT, lambda i: None, applies=Asked("blue"), skip=(skipped, 3), wants=FacetSet({"c"})
    )
    version = seams.version
    assert seams.wanted(EMIT, "red") == frozenset({"a", "b"})  # c's listener is blue's alone
    assert seams.wanted(EMIT, "blue") == frozenset({"a", "c"})  # b's is red's own
    assert not seams.has(EMIT, "red", OTHER_FACET, 5)
    assert dict(skipped) == {1: 5, 2: 5, 3: 5}
    assert seams.has(EMIT, "red", "b")
    everything = seams.on(EMIT, lambda i: None)
    assert seams.version > version
    assert seams.wanted(EMIT, "red") is None  # a listener wants every facet
    everything()
    blue_only()
    seams.on(EMIT, lambda i: None, wants=lambda facet: facet.startswith("x"))
    assert seams.wanted(EMIT, "blue") is None  # a facet no set names may reach it
