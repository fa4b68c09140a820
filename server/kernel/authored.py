"""A waterfall dispatch that also says which listener made its result.

A record caused by a chain's decision names who decided: an approval's `requested_by`
is the listener whose `ask` the chain returned, not an outer one that passed it on.
A listener made the result when it returned anything but what its `next()` last
returned (identity, not equality: two equal decisions of two listeners stay apart).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar, cast

from server.kernel.seams import Next, Registration, SeamRegistry, Waterfall, WaterfallListener

In = TypeVar("In")
Out = TypeVar("Out")

Author = Registration[WaterfallListener[In, Out]]


class _AuthoredChain(Generic[In, Out]):
    """One dispatch: the chain of `seams._Chain`, and at each level who made its value."""

    __slots__ = ("_listeners", "_default", "_carried", "_made", "author")

    def __init__(
        self,
        listeners: Sequence[Author[In, Out]],
        default: Out,
        carried: Callable[[In], Out] | None,
    ) -> None:
        self._listeners = listeners
        self._default = default
        self._carried = carried
        self._made: dict[int, object] = {}
        """Per level, the value it returned last (what its caller's `next()` got)."""
        self.author: Author[In, Out] | None = None
        """Who made the value the latest level returned; None: the chain's end."""

    async def run(self, index: int, current: In) -> Out:
        """Run the chain from listener `index` on `current`, keeping who made the result."""
        listeners = self._listeners
        if index == len(listeners):
            self.author = None
            carried = self._carried
            value = self._default if carried is None else carried(current)
        else:
            reg = listeners[index]
            result = reg.fn(current, Next(self.run, index + 1, current))
            value = cast(Out, await result) if inspect.isawaitable(result) else result
            if index + 1 not in self._made or value is not self._made[index + 1]:
                self.author = reg  # its own value, not the one its `next()` returned
        self._made[index] = value
        return value


async def authored_waterfall(
    seams: SeamRegistry,
    seam: Waterfall[In, Out],
    agent_id: str | None,
    build: Callable[[], In],
    default: Out,
    facet: str | None = None,
) -> tuple[Out, Author[In, Out] | None]:
    """`SeamRegistry.waterfall`, and the listener that made its result (None: no listener).

    As cheap as the plain dispatch when no listener sees it: no input is built.
    `facet` is the dispatch's facet (`SeamRegistry.waterfall`).
    """
    chain = seams.listeners(seam, agent_id, facet)
    if not chain:
        return default, None
    authored = _AuthoredChain(chain, default, seam.carried)
    value = await authored.run(0, build())
    return value, authored.author
