"""Helpers of the tool registry, pipeline and scheduler tests: tools made from a body,
hook contexts, and the types of bodies and seam listeners."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agentloop.v1 import decision_pb2 as d
from server.kernel.content import text_content
from server.kernel.seams import Next, ToolCallResult
from server.kernel.tools import ParallelSafe, Tool, ToolExecution, ToolOutcome, ToolValue

Execute = Callable[[ToolExecution], Awaitable[ToolValue]]
"""What a tool runs for a call."""

PreNext = Next[ToolExecution, d.PreToolDecision]
"""The `next` of a `tools/pre-execute` listener."""
ExecNext = Next[ToolExecution, ToolOutcome]
"""The `next` of a `tools/execute` wrapper."""
PostNext = Next[ToolCallResult, d.PostToolDecision]
"""The `next` of a `tools/post-execute` listener."""


async def ok(exec: ToolExecution) -> ToolValue:
    return f"{exec.name} ok"


def make_tool(
    name: str,
    execute: Execute = ok,
    *,
    parallel_safe: ParallelSafe = False,
    opt_in: bool = False,
    agent_id: str | None = None,
) -> Tool:
    """A tool named `name` running `execute`, described as "The NAME tool."."""
    return Tool(
        name=name,
        description=f"The {name} tool.",
        input_schema={"type": "object", "properties": {}},
        execute=execute,
        parallel_safe=parallel_safe,
        opt_in=opt_in,
        agent_id=agent_id,
    )


def context(text: str) -> d.HookContext:
    """A hook context carrying `text`."""
    return d.HookContext(content=text_content(text))
