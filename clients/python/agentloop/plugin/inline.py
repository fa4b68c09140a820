"""Handlers that cannot suspend, run in place: no task of their own per call.

A seam or observer handler written as an `async def` that never awaits (no `await`,
`async for` or `async with` in its body: the common "look at the call, return a
decision" handler, and every observer that only records) finishes the moment it is
called. Running it as a task of its own costs a task and an event-loop pass per call
and per notification before the result can be written. `never_suspends` tells such a
handler from its bytecode, once, when it is registered; the `Handle` stream then runs
its calls in place, as they are read (`agentloop.plugin.service`), in a copy of the
context like a task's, and writes the result at once.

A handler that awaits anything (or is not a plain `async def`: a callable object, a
partial, a function returning an awaitable) is run as a task, as before: only a task
may suspend, be cancelled by `CancelCall` or pass its deadline.
"""

from __future__ import annotations

import dis
import inspect
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

_SUSPENDING = frozenset(
    {
        "GET_AWAITABLE",  # await
        "GET_AITER",  # async for
        "GET_ANEXT",
        "END_ASYNC_FOR",
        "BEFORE_ASYNC_WITH",  # async with
        "SEND",
        "YIELD_VALUE",
    }
)
"""The instructions of a coroutine that may suspend it."""


def never_suspends(handler: Callable[..., Any]) -> bool:
    """Whether `handler` is an `async def` whose body cannot suspend (it never awaits)."""
    function = getattr(handler, "__func__", handler)  # a bound method: its function
    if not isinstance(function, types.FunctionType):
        return False
    if not function.__code__.co_flags & inspect.CO_COROUTINE:  # not an `async def` itself
        return False
    return not any(i.opname in _SUSPENDING for i in dis.get_instructions(function))


@types.coroutine
def resumed(coro: Coroutine[Any, Any, T], waiting: Any) -> Generator[Any, Any, T]:
    """The rest of `coro`, whose first step (run in place) yielded `waiting`.

    Awaited by a task, it hands every suspension, value and exception (a cancel) on
    to `coro`, as if the task had run it from the start.
    """
    while True:
        try:
            sent = yield waiting
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                waiting = coro.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                waiting = coro.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
