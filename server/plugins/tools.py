"""Plugin tools: a plugin's tool definitions as tools whose body runs in the plugin."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format

from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.kernel.abort import NEVER
from server.kernel.errors import TurnFatal
from server.kernel.tools import Tool, ToolExecution, ToolReturn
from server.observability import observe
from server.plugins.calls import (
    PluginCaller,
    PluginCallFailed,
    PluginStats,
    call_ids,
    checked,
    invocation,
)


def tool_schema(definition: hk.ToolDefinition) -> dict[str, Any]:
    """A plugin tool's input schema as JSON data.

    Raises:
        ValueError: the schema holds a number JSON cannot carry (NaN, an infinity).
    """
    schema: dict[str, Any] = json.loads(json_format.MessageToJson(definition.input_schema))
    return schema


def remote_tool(
    plugin: str,
    definition: hk.ToolDefinition,
    caller: PluginCaller,
    stats: PluginStats,
    session_of: Callable[[str], str],
    timeout: float,
) -> Tool:
    """A tool whose body runs in the plugin; failures become error results."""

    async def execute(exec: ToolExecution) -> ToolReturn:
        call = hk.HookCall(
            call_id=f"t{next(call_ids)}",
            kind=hk.CALL_KIND_TOOL_EXECUTE,
            agent_id=exec.agent_id,
            session_id=session_of(exec.agent_id),
            turn=exec.turn,
            step=exec.step,
            tool_execute=hk.ToolExecuteCall(invocation=invocation(exec)),
        )
        call.timeout.FromNanoseconds(int(timeout * 1e9))
        try:
            with observe.plugin_call_scope(
                plugin, "tools/execute", exec.agent_id, exec.turn, exec.step, call
            ):
                result = await caller.call(call, timeout, exec.signal or NEVER)
            checked(result, "tool_execute")
        except PluginCallFailed as failure:
            stats.errors += failure.kind != "timeout"
            raise TurnFatal(
                f'plugin "{plugin}" failed at tools/execute ({definition.name}): '
                f"{failure.kind}: {failure}",
                f"PLUGIN_{failure.kind.upper()}",
            ) from None
        output = result.tool_execute
        meta = json_format.MessageToDict(output.meta) if output.HasField("meta") else None
        return ToolReturn(
            content=list(output.content),
            is_error=output.is_error,
            meta=meta,
            contexts=list(output.additional_contexts),
        )

    return Tool(
        name=definition.name,
        description=definition.description,
        input_schema=tool_schema(definition),
        execute=execute,
        parallel_safe=definition.parallel_safe,
        # Offered only to agents that enable it by name and that its filter allows.
        opt_in=True,
        agents=frozenset(definition.agent_ids),
    )
