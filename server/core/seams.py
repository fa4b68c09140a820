"""The seam registry: one ordered list of listeners per seam, three ways to dispatch.

Every extension point of the loop is a named seam. Listeners are kept in one order,
by order number and then by name (registration order breaks the remaining ties), so
that in-process and remote listeners interleave predictably. A listener is global or
scoped to one agent; a scoped listener only sees dispatches for its agent.

- `waterfall`: around-middleware. Each listener is called as `fn(*args, next)` and may
  await `next()` (the rest of the chain, ending in the loop's default), transform the
  result, call `next(*new_args)` so the rest of the chain sees transformed arguments,
  or return its own value without calling `next()`. A throw propagates.
- `serial`: listeners are awaited one at a time; the first "bail" value (anything but
  None or False) stops the chain and is returned. A throw propagates.
- `emit`: notifications. Every listener runs; a throw (or a failed coroutine) is
  logged, counted and contained.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# Waterfalls.
PROMPT_SUBMIT = "agent/prompt-submit"
SESSION_PREFIX = "agent/session-prefix"
REQUEST = "agent/request"
STEP_RESULT = "agent/step-result"
TURN_CONTINUATION = "agent/turn-continuation"
SYSTEM_PROMPT_ASSEMBLE = "system-prompt/assemble"
TOOLS_PRE_EXECUTE = "tools/pre-execute"
TOOLS_EXECUTE = "tools/execute"
TOOLS_POST_EXECUTE = "tools/post-execute"
# Serial checkpoints.
PRE_STEP = "agent/pre-step"
TURN_STOP = "agent/turn-stop"
# Emits.
SESSION_START = "agent/session-start"
STATUS = "agent/status"
QUEUED = "agent/queued"
ERROR = "agent/error"
CREATED = "agent/created"
DISPOSED = "agent/disposed"
TOOLS_RESULT = "tools/result"
TOOLS_RESULT_COMMITTED = "tools/result-committed"
"""Each final tool result once its `tool/result` event is stored: what plugins observe."""
SESSION_EVENT = "session/event"
"""Every appended session event, as `(agent, event)`, in-process, at the append."""
SESSION_COMMITTED = "session/committed"
"""Every session event once it is stored, as `(agent, event)`: what plugins observe."""
AGENT_EVENT = "agent/event"
"""Every live agent event, as `(agent, AgentEvent)`."""
# Approvers (called concurrently by `server.core.approvals`, not dispatched as a chain).
TOOLS_APPROVAL = "tools/approval"
"""Approvers of pending approvals, as `fn(agent_id, request, signal)` -> answer or None."""

Listener = Callable[..., Any]


@dataclass(eq=False)
class Registration:
    """One listener on one seam."""

    seam: str
    fn: Listener
    order: int
    name: str
    agent_id: str | None
    serial: int = field(default=0)

    def sort_key(self) -> tuple[int, str, int]:
        """Order number, then name, then registration order."""
        return (self.order, self.name, self.serial)


class SeamRegistry:
    """Listeners of every seam, in dispatch order."""

    def __init__(self) -> None:
        self._by_seam: dict[str, list[Registration]] = {}
        self._scoped: set[str] = set()
        """Seams with an agent-scoped listener; the others need no filtering per dispatch."""
        self._counter = 0
        self.contained_failures = 0
        """How many emit listeners failed (each is logged too)."""
        self._tasks: set[asyncio.Task[Any]] = set()

    def on(
        self,
        seam: str,
        fn: Listener,
        *,
        order: int = 0,
        name: str = "",
        agent_id: str | None = None,
        prepend: bool = False,
    ) -> Callable[[], None]:
        """Register `fn` on `seam`; returns a disposer that removes it.

        `prepend` places the listener ahead of every ordinary one (order -10**9).
        """
        self._counter += 1
        reg = Registration(seam, fn, -(10**9) if prepend else order, name, agent_id, self._counter)
        listeners = [*self._by_seam.get(seam, []), reg]
        listeners.sort(key=Registration.sort_key)
        self._set(seam, listeners)

        def dispose() -> None:
            current = self._by_seam.get(seam, [])
            if reg in current:
                self._set(seam, [r for r in current if r is not reg])

        return dispose

    def remove_agent(self, agent_id: str) -> None:
        """Remove every listener scoped to `agent_id`."""
        for seam, listeners in list(self._by_seam.items()):
            self._set(seam, [r for r in listeners if r.agent_id != agent_id])

    def _set(self, seam: str, listeners: list[Registration]) -> None:
        # Lists are replaced, never changed in place: a dispatch may hold the old one.
        self._by_seam[seam] = listeners
        if any(r.agent_id is not None for r in listeners):
            self._scoped.add(seam)
        else:
            self._scoped.discard(seam)

    def listeners(self, seam: str, agent_id: str | None) -> list[Registration]:
        """The listeners that see a dispatch of `seam` for `agent_id`, in order (read-only)."""
        regs = self._by_seam.get(seam)
        if not regs:
            return []
        if seam not in self._scoped:
            return regs  # every listener is global; the list is never changed in place
        return [r for r in regs if r.agent_id is None or r.agent_id == agent_id]

    def has(self, seam: str, agent_id: str | None) -> bool:
        """Whether any listener would see a dispatch of `seam` for `agent_id`."""
        return bool(self.listeners(seam, agent_id))

    async def waterfall(
        self,
        seam: str,
        agent_id: str | None,
        args: tuple[Any, ...],
        default: T,
        value_at: int | None = None,
    ) -> T:
        """Run the around-middleware chain; the innermost `next()` returns the default.

        A listener may call `next(*new_args)` to pass transformed arguments to the rest
        of the chain. When `value_at` is given, the value under transformation is
        `args[value_at]` and the innermost `next()` returns it as it arrived (so a
        transformed value is the result when nobody else changes it); otherwise the
        innermost `next()` returns `default`.
        """
        chain = self.listeners(seam, agent_id)
        if not chain:
            return default

        async def call(index: int, current: tuple[Any, ...]) -> T:
            if index == len(chain):
                return default if value_at is None else current[value_at]

            def next_(*replacement: Any) -> Awaitable[T]:
                return call(index + 1, replacement or current)

            result = chain[index].fn(*current, next_)
            if inspect.isawaitable(result):
                result = await result
            return result  # type: ignore[no-any-return]

        return await call(0, args)

    async def serial(self, seam: str, agent_id: str | None, args: tuple[Any, ...]) -> Any:
        """Await each listener in order; return the first bail value, else None."""
        for reg in self.listeners(seam, agent_id):
            result = reg.fn(*args)
            if inspect.isawaitable(result):
                result = await result
            if result is not None and result is not False:
                return result
        return None

    def emit(self, seam: str, agent_id: str | None, args: tuple[Any, ...]) -> None:
        """Notify every listener; failures are logged and contained."""
        for reg in self.listeners(seam, agent_id):
            try:
                result = reg.fn(*args)
            except Exception:
                self._contain(seam, reg)
                continue
            if result is not None and inspect.iscoroutine(result):
                task = asyncio.ensure_future(result)
                self._tasks.add(task)
                task.add_done_callback(functools.partial(self._settled, seam, reg))

    async def close(self) -> None:
        """Cancel the emit listeners still running and wait for them (server shutdown)."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _settled(self, seam: str, reg: Registration, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.contained_failures += 1
            log.warning(
                "listener %r on %s failed", reg.name or reg.fn, seam, exc_info=task.exception()
            )

    def _contain(self, seam: str, reg: Registration) -> None:
        self.contained_failures += 1
        log.warning("listener %r on %s failed", reg.name or reg.fn, seam, exc_info=True)
