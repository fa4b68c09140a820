"""Structured tasks: a group that owns the tasks it starts, and the one cancel-and-wait.

An agent's driver and everything it starts in the background (tool calls of the
rolling pool, approval asks, idle-injection flushes) live in the agent's `TaskGroup`:
disposal ends the driver's turn, then closes the group (what is left is cancelled
and awaited), so no task of an agent outlives it. Unlike `asyncio.TaskGroup`, a
failing member does not cancel its siblings (a tool's crash is that call's result),
and the group is not an `async with` block: its owner closes it when it is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Spawn(Protocol):
    """Starts a task: `TaskGroup.start` (the owner's group), or `spawn` (no owner)."""

    def __call__(self, work: Coroutine[Any, Any, T], /) -> asyncio.Future[T]:
        """Run `work` as a task."""
        ...


def spawn(work: Coroutine[Any, Any, T], /) -> asyncio.Task[T]:
    """Start a task that no group owns (work driven outside an agent, e.g. in tests)."""
    return asyncio.get_running_loop().create_task(work)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel every task not done yet, then wait until each has finished.

    Their results and errors are dropped: whoever needs them awaits them itself.
    """
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


class TaskGroup:
    """The tasks of one owner, started here, cancelled and awaited together."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, work: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Run `work` as a task of the group; it leaves the group when it ends.

        So an idle owner holds no ended task, nor the result that task kept.
        """
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        """How many tasks of the group are still running."""
        return len(self._tasks)

    def cancel(self) -> None:
        """Cancel every task of the group (its owner is being shut down)."""
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        """Cancel what is still running and wait until every task has ended.

        Tasks started meanwhile (by a task being cancelled) are cancelled too.
        """
        while self._tasks:
            await cancel_and_wait(list(self._tasks))
