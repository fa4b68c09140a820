"""A cancel scope: the one way a running turn is cancelled, with a reason.

Trio-style, on asyncio, built the way `asyncio.timeout` is (`Task.cancel()`, then
`Task.uncancel()` when the cancellation is caught). `cancel(reason)` records that the
scope is cancelled, fires its abort signal at once (so a plugin gets a cancel notice and
a provider drops its request, with the reason), and cancels the task running in the
scope where it awaits next. Where the loop must notice a cancel without awaiting (the
reference's checkpoints), `checkpoint()` raises the same cancellation. The owner turns
a cancellation it `caught()` into its verdict (an interrupted turn); a cancellation
that is not the scope's (the driver itself being cancelled, a shutdown) propagates.

Work that must finish once started (a tool batch commits the calls it started) runs
`shielded()`: a cancel then only fires the signal, which that work watches.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from server.kernel.abort import AbortController, AbortSignal
from server.kernel.errors import Aborted


class CancelScope:
    """The cancellation of one unit of work (a turn) and of the task running it."""

    def __init__(self) -> None:
        self.controller = AbortController()
        self.signal: AbortSignal = self.controller.signal
        """Fires (once, with the first reason) when the scope is cancelled."""
        self.reason: str | None = None
        """The cancel reason the owner reports (the latest `mark`); None if not marked."""
        self.cancel_called = False
        """Whether the scope was cancelled (marked or fired)."""
        self._task: asyncio.Task[Any] | None = None
        self._shielded = 0
        self._delivered = False
        self._caught = False

    def __enter__(self) -> CancelScope:
        self._task = asyncio.current_task()
        return self

    def __exit__(self, *exc: object) -> None:
        self._withdraw()
        self._task = None

    def mark(self, reason: str | None) -> None:
        """Record a cancel (with the reason to report) without firing anything yet.

        A cancel that came before the scope's work began is a marker: the work sees
        it at its first checkpoint.
        """
        self.cancel_called = True
        if reason is not None:
            self.reason = reason

    def cancel(self, reason: str) -> None:
        """Fire the signal with `reason` and cancel the task in the scope (once)."""
        self.cancel_called = True
        if self.signal.aborted:
            return
        self.controller.abort(reason)
        # Delivered once the callbacks the signal scheduled have run: a boundary that
        # watches the signal (a plugin call, a provider) ends with its own reason first.
        asyncio.get_running_loop().call_soon(self._deliver)

    def checkpoint(self) -> None:
        """Raise the scope's cancellation if it was cancelled."""
        if self.cancel_called:
            raise asyncio.CancelledError

    def shielded(self) -> _Shield:
        """A block that a cancel reaches through the signal only (no task cancel)."""
        return _Shield(self)  # made per use: kept on the scope, it would be a cycle

    def caught(self, error: BaseException) -> bool:
        """Whether `error` is this scope's cancellation; if so, it is withdrawn.

        A `CancelledError` is the scope's when the scope was cancelled and nothing else
        cancelled the task too. `Aborted` (a boundary that watched the signal) is the
        scope's when the signal fired.
        """
        if isinstance(error, Aborted):
            if not self.signal.aborted:
                return False
        elif not isinstance(error, asyncio.CancelledError) or not self.cancel_called:
            return False
        self._withdraw()
        task = asyncio.current_task()
        return task is None or task.cancelling() == 0

    def _deliver(self) -> None:
        task = self._task
        if task is None or task.done() or self._shielded or self._caught or self._delivered:
            return
        self._delivered = True
        task.cancel()

    def _withdraw(self) -> None:
        """The cancellation is handled: take back the task cancel, deliver no more."""
        self._caught = True
        if self._delivered and self._task is not None:
            self._delivered = False
            self._task.uncancel()


class _Shield:
    """`with scope.shielded():` (a plain context manager: it runs for every step)."""

    __slots__ = ("_scope",)

    def __init__(self, scope: CancelScope) -> None:
        self._scope = scope

    def __enter__(self) -> None:
        self._scope._shielded += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._scope._shielded -= 1
