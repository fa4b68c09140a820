"""The listener of each seam mode, made from a subscription and its seam's typed codec.

One adapter per mode of the seam table; each is given, per seam, how its input fills
the call (`fill`), how the decision is read from the result (`read`) and what the
decision does (the `*_codecs.py` modules declare them; `server.plugins.codecs` joins
them into one table). On a transforming seam (`Transform`, `Wrap`) the plugin gets the
current value and returns a decision; an empty decision means "continue unchanged",
and the next listener sees the result. A checkpoint (`Check`) may bail out of the
chain. Observers (`Watch`) are notifications and never block the loop. Approvers
(`Approve`) are called by the approvals, concurrently; each answers or abstains.
Every listener first runs the subscription's match conditions (`server.plugins.conditions`)
over the input, read through the seam's `Facets`: a call they exclude is counted as
skipped and never made, and the chain goes on as if the plugin had not been there.
The agent conditions are asked once per agent, by the seam registry: an agent they
exclude has no listener of the plugin at all (`RemoteListener.on`), only the count.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from google.protobuf.message import Message as ProtoMessage

from server.kernel import seams as S
from server.kernel.seams import Next, SeamRegistry
from server.plugins.conditions import Facets
from server.plugins.listeners import Fill, Located, Read, RemoteListener


class Addressed(Protocol):
    """The agent an observed input is about."""

    @property
    def agent_id(self) -> str:
        """The agent."""
        ...


A = TypeVar("A", bound=Addressed)
L = TypeVar("L", bound=Located)
Out = TypeVar("Out")
R = TypeVar("R", bound=ProtoMessage)


class Codec(Protocol):
    """How one seam's listener is made from a subscription."""

    @property
    def key(self) -> S.SeamKey:
        """The seam."""
        ...

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """Register the subscription's listener; returns the disposer."""
        ...


@dataclass(frozen=True)
class Transform(Generic[L, Out, R]):
    """A waterfall: the input goes out, the decision `R` comes back and is applied."""

    key: S.Waterfall[L, Out]
    fill: Fill[L]
    read: Read[R]
    apply: Callable[[L, R, Next[L, Out]], Awaitable[Out]]
    """What a decision does: usually `next(input with the decision's value)`."""
    facets: Facets[L] = Facets()
    """What match conditions can look at in the input."""

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener asks the plugin, then applies its decision (none: `next()`)."""
        fill, read, apply = self.fill, self.read, self.apply
        matches = remote.matcher(self.facets)
        skipped, seam = remote.skip_count

        async def listener(input: L, next_: Next[L, Out]) -> Out:
            if matches is not None and not matches(input):
                skipped[seam] += 1
                return await next_()
            decision = await remote.ask(input, fill, input, read)
            if decision is None:
                return await next_()
            return await apply(input, decision, next_)

        return remote.on(seams, self.key, listener, self.facets)


@dataclass(frozen=True)
class Wrap(Generic[L, Out, R]):
    """A waterfall that flows outward: the plugin sees what the rest composed."""

    key: S.Waterfall[L, Out]
    fill: Fill[Out]
    read: Read[R]
    apply: Callable[[R], Out]
    facets: Facets[L] = Facets()
    """What match conditions can look at in the input."""

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener awaits `next()`, then the plugin may replace its result."""
        fill, read, apply = self.fill, self.read, self.apply
        matches = remote.matcher(self.facets)
        skipped, seam = remote.skip_count

        async def listener(input: L, next_: Next[L, Out]) -> Out:
            inner = await next_()
            if matches is not None and not matches(input):
                skipped[seam] += 1
                return inner
            decision = await remote.ask(input, fill, inner, read)
            return inner if decision is None else apply(decision)

        return remote.on(seams, self.key, listener, self.facets)


@dataclass(frozen=True)
class Check(Generic[L, Out, R]):
    """A checkpoint: the plugin's decision may bail out of the chain."""

    key: S.Serial[L, Out]
    fill: Fill[L]
    read: Read[R]
    decide: Callable[[L, R], Out | None]
    """The bail value of a decision; None goes on to the next listener."""
    facets: Facets[L] = Facets()
    """What match conditions can look at in the input."""

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener asks the plugin; its decision says whether to bail."""
        fill, read, decide = self.fill, self.read, self.decide
        matches = remote.matcher(self.facets)
        skipped, seam = remote.skip_count

        async def listener(input: L) -> Out | None:
            if matches is not None and not matches(input):
                skipped[seam] += 1
                return None
            decision = await remote.ask(input, fill, input, read)
            return None if decision is None else decide(input, decision)

        return remote.on(seams, self.key, listener, self.facets)


@dataclass(frozen=True)
class Watch(Generic[A]):
    """An observer: filtered, then admitted, and only then built (never blocking)."""

    key: S.Emit[A]
    fill: Fill[A]
    facets: Facets[A] = Facets()
    """What match conditions can look at in the input."""

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener sends a notification when there is room."""
        # Bound once: observers run for every event, chunks included.
        caller, slot, fill = remote.caller, remote.slot, self.fill
        matches = remote.matcher(self.facets)
        skipped, seam = remote.skip_count

        def listener(input: A) -> None:
            if matches is not None and not matches(input):
                skipped[seam] += 1
                return
            if caller.admit(slot):
                call = remote.notice(input.agent_id)
                fill(input, call)
                caller.notify(call, slot)

        return remote.on(seams, self.key, listener, self.facets)


@dataclass(frozen=True)
class Approve(Generic[R]):
    """An approver: called concurrently by the approvals; a failure abstains.

    Without a timeout of its own the call waits as long as the approval does; it is
    withdrawn (`CancelCall`) when the approval ends otherwise.
    """

    key: S.Gather[S.ApprovalAsk, S.ApprovalAnswer]
    fill: Fill[S.ApprovalAsk]
    read: Read[R]
    answer: Callable[[R], S.ApprovalAnswer]
    facets: Facets[S.ApprovalAsk] = Facets()
    """What match conditions can look at in the input."""

    def register(self, remote: RemoteListener, seams: SeamRegistry) -> Callable[[], None]:
        """The listener asks the plugin (`RemoteListener.ask`) and answers its decision."""
        fill, read, answer = self.fill, self.read, self.answer
        own_timeout = remote.subscription.HasField("timeout")
        matches = remote.matcher(self.facets)
        skipped, seam = remote.skip_count

        async def listener(ask: S.ApprovalAsk) -> S.ApprovalAnswer:
            if matches is not None and not matches(ask):
                skipped[seam] += 1
                return None
            seconds = None
            if not own_timeout:
                expires = ask.request.expire_time.ToNanoseconds() / 1e9
                seconds = max(expires - time.time(), 0.001)
            decision = await remote.ask(ask, fill, ask, read, seconds)
            return None if decision is None else answer(decision)

        return remote.on(seams, self.key, listener, self.facets)
