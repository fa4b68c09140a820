"""A running tool call's progress, shown to the agent's live observers, bounded.

Each call gets its own reporter. At most one `tool_progress` event per
`MIN_INTERVAL` goes out per call (the reports in between are dropped, never queued),
except a report that reaches its total, which always goes. The message is cut to
`MAX_MESSAGE` characters. The events are live only: nothing enters the session log.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import content_pb2
from server.kernel.tools import ToolProgress

if TYPE_CHECKING:
    from server.loop.agent import Agent

MIN_INTERVAL = 0.2
"""Seconds between two progress events of one call (5 a second)."""
MAX_MESSAGE = 200
"""The most characters of a progress message."""

Reporter = Callable[[ToolProgress], None]


class ProgressReports:
    """Makes the progress reporter of each call of one step."""

    def __init__(self, agent: Agent, turn: int, step: int) -> None:
        self._agent = agent
        self._turn = turn
        self._step = step

    def __call__(self, call: content_pb2.ToolCallBlock) -> Reporter:
        """The reporter of `call`."""
        last = -math.inf

        def report(progress: ToolProgress) -> None:
            nonlocal last
            now = time.monotonic()
            done = progress.total is not None and progress.progress >= progress.total
            if now - last < MIN_INTERVAL and not done:
                return
            last = now
            event = ae.ToolProgress(
                tool_call_id=call.id,
                tool_name=call.name,
                turn=self._turn,
                step=self._step,
                progress=progress.progress,
                message=progress.message[:MAX_MESSAGE],
            )
            if progress.total is not None:
                event.total = progress.total
            self._agent.emit(None, None, ae.AgentEvent(tool_progress=event))

        return report
