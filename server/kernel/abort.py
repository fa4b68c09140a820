"""Abort signals: a one-shot, reason-carrying cancellation shared by a step's work."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

from server.kernel.errors import Aborted

T = TypeVar("T")


class AbortSignal:
    """Read side of an abort: whether it fired, why, and a way to wait for it."""

    def __init__(self) -> None:
        self._reason: str | None = None
        self._callbacks: list[Callable[[str], None]] = []
        self._event: asyncio.Event | None = None

    @property
    def aborted(self) -> bool:
        """True once the controller aborted."""
        return self._reason is not None

    @property
    def reason(self) -> str:
        """The abort reason; empty while not aborted."""
        return self._reason or ""

    def raise_if_aborted(self) -> None:
        """Raise `Aborted` when the signal fired."""
        if self._reason is not None:
            raise Aborted(self._reason)

    def on_abort(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call `callback(reason)` on abort (at once if already aborted); returns a remover."""
        if self._reason is not None:
            callback(self._reason)
            return lambda: None
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    async def wait(self) -> str:
        """Wait until aborted; returns the reason."""
        if self._reason is None:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        return self.reason

    async def race(self, work: Awaitable[T]) -> T:
        """Await `work`, cancelling it and raising `Aborted` if the signal fires first."""
        if self._reason is not None:
            if inspect.iscoroutine(work):
                work.close()  # never started: close it rather than leak it
            raise Aborted(self._reason)
        task = asyncio.ensure_future(work)

        def cancel(_reason: str) -> None:
            task.cancel()

        remove = self.on_abort(cancel)
        try:
            return await task
        except asyncio.CancelledError:
            if self._reason is not None and task.cancelled():
                raise Aborted(self._reason) from None
            raise
        finally:
            remove()

    def _fire(self, reason: str) -> None:
        if self._reason is not None:
            return
        self._reason = reason
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(reason)
        if self._event is not None:
            self._event.set()


class AbortController:
    """Write side of an abort: owns one signal and fires it once."""

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: str = "cancelled") -> None:
        """Fire the signal with `reason`; later calls do nothing."""
        self.signal._fire(reason)


class _Never(AbortSignal):
    """A signal that never fires: it keeps no callbacks and races nothing.

    Shared by every caller, so it holds no state: `on_abort` stores nothing (the
    callback could never run) and `race` awaits the work in the caller's own task.
    """

    def on_abort(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Nothing to register: it never fires."""
        return _nothing

    async def wait(self) -> str:
        """Wait forever (until the caller is cancelled)."""
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")  # pragma: no cover

    async def race(self, work: Awaitable[T]) -> T:
        """Await `work`: nothing can abort it."""
        return await work


def _nothing() -> None:
    pass


NEVER: AbortSignal = _Never()
"""A signal that never fires, for work with no owner to cancel it (stateless)."""
