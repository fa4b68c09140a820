"""A plugin for the benchmark: the SDK, subscribed to every seam, always "continue".

With `--turn-end-only` its session-event observer asks for `turn_end` events only;
with `--observer-only` it is nothing but a session-event observer of every event; with
`--watch-only` it only watches every seam (`observe_only`: notifications, no answers);
with `--match-nothing` every subscription (approvals and compactions too) carries match
conditions no call of the workload meets: the server should make no call at all; with
`--match-no-facet` only the tool seams and the event observers subscribe, with tool-name
and event-kind conditions alone (the agent matches: each call is skipped by its facet).
`--buffer N` sets the observer's buffer (`buffer_size`: N notifications may wait).
`--listen ADDRESS` serves there (a `unix:/path` socket, say) instead of 127.0.0.1:0.
Prints "plugin every-seam listening on HOST:PORT" when ready.
"""

from __future__ import annotations

import sys
from typing import Any

from agentloop.plugin.sdk import Plugin

plugin = Plugin("every-seam", version="bench")


async def proceed(call: Any) -> None:
    """Continue unchanged."""
    return None


async def observe(call: Any) -> None:
    """Notifications need no answer."""


if "--observer-only" in sys.argv:
    buffer = int(sys.argv[sys.argv.index("--buffer") + 1]) if "--buffer" in sys.argv else 0
    plugin.on_session_event(buffer_size=buffer)(observe)
elif "--match-nothing" in sys.argv:
    # An agent label no agent has, on every seam; and each seam's own condition besides.
    nobody: dict[str, Any] = {"agent_labels": {"bench": "nobody"}}
    plugin.prompt_submit(**nobody, prompt_prefix="/never")(proceed)
    for path in (
        "agent/session-prefix", "agent/pre-step", "agent/request", "agent/step-result",
        "agent/turn-continuation", "agent/turn-stop", "agent/compact",
    ):  # fmt: skip
        plugin.on(path, **nobody)(proceed)
    for path in (
        "tools/pre-execute", "tools/post-execute", "tools/approval", "tools/result-committed",
    ):  # fmt: skip
        plugin.on(path, **nobody, tools=["never_*"])(proceed)
    plugin.on_session_event(**nobody, event_kinds=["prompt_blocked"])(observe)
    plugin.on_agent_event(**nobody, event_kinds=["compaction"])(observe)
elif "--match-no-facet" in sys.argv:
    for path in ("tools/pre-execute", "tools/post-execute", "tools/result-committed"):
        plugin.on(path, tools=["never_*"])(proceed)
    plugin.on_session_event(event_kinds=["prompt_blocked"])(observe)
    plugin.on_agent_event(event_kinds=["compaction"])(observe)
else:
    for decorator in (
        plugin.prompt_submit, plugin.session_prefix, plugin.pre_step, plugin.request,
        plugin.step_result, plugin.turn_continuation, plugin.turn_stop,
        plugin.tools_pre_execute, plugin.tools_post_execute,
    ):  # fmt: skip
        decorator(observe_only="--watch-only" in sys.argv)(proceed)
    kinds = ["turn_end"] if "--turn-end-only" in sys.argv else []
    plugin.on_session_event(event_kinds=kinds)(observe)
    for observer in (plugin.on_agent_event, plugin.on_tool_result):
        observer()(observe)

if __name__ == "__main__":
    listen = sys.argv[sys.argv.index("--listen") + 1] if "--listen" in sys.argv else "127.0.0.1:0"
    plugin.run(listen)
