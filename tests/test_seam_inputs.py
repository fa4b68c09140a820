"""A seam's input is built only when a listener sees the dispatch, and then once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agentloop.v1 import content_pb2 as c
from server.kernel import seams as S
from server.kernel.seams import Next, SeamRegistry
from tests.harness import Harness

WATERFALL: S.Waterfall[str, str] = S.Waterfall("test/waterfall")
CARRIED: S.Waterfall[str, str] = S.Waterfall("test/carried", lambda i: i)
SERIAL: S.Serial[str, str] = S.Serial("test/serial")


class Builds:
    """An input builder that counts its calls."""

    def __init__(self, value: str = "input") -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        return self.value


async def test_no_listener_builds_no_input() -> None:
    seams = SeamRegistry()
    built = Builds()
    assert await seams.waterfall(WATERFALL, "a", built, "default") == "default"
    assert await seams.serial(SERIAL, "a", built) is None
    assert built.calls == 0


async def test_a_listener_scoped_to_another_agent_builds_no_input() -> None:
    seams = SeamRegistry()
    seams.on(WATERFALL, lambda i, nxt: "b's", agent_id="b")
    seams.on(SERIAL, lambda i: "b's", agent_id="b")
    built = Builds()
    assert await seams.waterfall(WATERFALL, "a", built, "default") == "default"
    assert await seams.serial(SERIAL, "a", built) is None
    assert built.calls == 0
    assert await seams.waterfall(WATERFALL, "b", built, "default") == "b's"
    assert await seams.serial(SERIAL, "b", built) == "b's"
    assert built.calls == 2


async def test_the_chain_sees_the_one_built_input() -> None:
    seams = SeamRegistry()
    seen: list[str] = []

    def outer(i: str, nxt: Next[str, str]) -> Awaitable[str]:
        seen.append(i)
        return nxt()

    async def inner(i: str, nxt: Next[str, str]) -> str:
        seen.append(i)
        return (await nxt(i + "+")).upper()

    seams.on(CARRIED, outer, order=1)
    seams.on(CARRIED, inner, order=2)
    built = Builds("x")
    assert await seams.waterfall(CARRIED, None, built, "default") == "X+"
    assert seen == ["x", "x"] and built.calls == 1

    answers: list[Callable[[str], str | None]] = [lambda i: None, lambda i: f"bail on {i}"]
    for answer in answers:
        seams.on(SERIAL, answer)
    assert await seams.serial(SERIAL, None, built) == "bail on x"
    assert built.calls == 2


async def test_a_loop_seam_without_listener_is_skipped_and_with_one_sees_its_input(
    harness: Harness,
) -> None:
    agent = await harness.create()
    configs: list[tuple[int, int, str]] = []

    def on_request(i: S.Request, nxt: Next[S.Request, c.ModelConfig]) -> Awaitable[c.ModelConfig]:
        configs.append((i.turn, i.step, i.config.provider))
        return nxt()

    await harness.turn(agent, "one")  # no listener: the default config
    harness.runtime.seams.on(S.REQUEST, on_request)
    await harness.turn(agent, "two")
    assert configs == [(2, 1, "scripted")]
