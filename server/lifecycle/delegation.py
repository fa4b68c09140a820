"""The `delegate` and `collect` tools: an agent hands a task to a sub-agent it owns.

`delegate` creates a child of the calling agent (CreateAgent with `parent`), sends it the
task and, in the foreground, waits for the child's turn and returns its final answer;
in the background it returns the child's id at once, and `collect` returns the answer
later (or the progress so far). A collected or foreground child is disposed once its
answer is taken: its session stays readable (the result's meta points to it). Both are
opt-in by name, like every built-in tool. Everything here is plain API too: a plugin
builds the same team with CreateAgent, SendMessage, WaitIdle, ReadSession and
DisposeAgent.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.content import plain_text
from server.kernel.errors import Aborted, AgentLoopError
from server.kernel.tools import Tool, ToolArgumentsError, ToolExecution, ToolReturn
from server.loop.agent import Agent
from server.loop.builtin_tools import DELEGATION_TOOLS
from server.settings.profiles import SubagentProfile

if TYPE_CHECKING:
    from server.lifecycle.factory import AgentFactory

DELEGATE, COLLECT = DELEGATION_TOOLS
MODES = ("foreground", "background")
MAX_ID = 128
PROGRESS_TEXT = 200
"""Characters of a child's latest text that a progress event carries."""


def delegation_tools(factory: AgentFactory, profiles: Sequence[SubagentProfile] = ()) -> list[Tool]:
    """The two tools, bound to the factory that owns the children and the config's profiles."""
    team = Delegation(factory, {profile.name: profile for profile in profiles})
    return [
        Tool(
            name=DELEGATE,
            description=(
                "Hands a task to a sub-agent with a context of its own. Foreground (the"
                " default) waits and returns the sub-agent's final answer; background"
                " returns its id at once: collect its answer later with `collect`."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "task": {"type": "string", "description": "What the sub-agent must do."},
                    "mode": {"type": "string", "enum": list(MODES)},
                    "profile": {"type": "string", "description": "A sub-agent profile name."},
                },
                "required": ["task"],
                "additionalProperties": False,
            },
            execute=team.delegate,
            parallel_safe=True,
        ),
        Tool(
            name=COLLECT,
            description=(
                "Returns the final answer of a background sub-agent (waiting for it"
                " unless wait is false, then its progress so far)."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "agent_id": {"type": "string", "description": "The sub-agent's id."},
                    "wait": {"type": "boolean"},
                },
                "required": ["agent_id"],
                "additionalProperties": False,
            },
            execute=team.collect,
            parallel_safe=True,
        ),
    ]


def child_options(
    parent: agent_pb2.AgentOptions,
    profile: str,
    configured: Mapping[str, SubagentProfile] | None = None,
) -> agent_pb2.AgentOptions:
    """A child's options: the named profile, else the parent's less its delegation tools.

    A profile of the parent's own options wins over the server config's of that name.
    The parent's provider options (a scripted agent's script) stay the parent's own.
    """
    configured = configured or {}
    if profile:
        if profile in parent.subagent_profiles:
            options = agent_pb2.AgentOptions()
            options.CopyFrom(parent.subagent_profiles[profile])
            return options
        if profile in configured:
            return profile_options(parent, configured[profile])
        known = ", ".join(sorted({*parent.subagent_profiles, *configured})) or "none"
        raise ToolArgumentsError(f'{DELEGATE}: unknown profile "{profile}" (known: {known})')
    options = agent_pb2.AgentOptions(
        provider=parent.provider,
        model=parent.model,
        tools=[t for t in parent.tools if t not in (DELEGATE, COLLECT)],
        persona=parent.persona,
        approval_required_tools=parent.approval_required_tools,
        labels=parent.labels,
    )
    if parent.HasField("approval_timeout"):
        options.approval_timeout.CopyFrom(parent.approval_timeout)
    return options


def profile_options(
    parent: agent_pb2.AgentOptions, profile: SubagentProfile
) -> agent_pb2.AgentOptions:
    """A child's options under a config profile: its settings, the parent's for the rest.

    Its `tools` keep only those the parent has; its `grant_tools` are given regardless.
    """
    inherited = child_options(parent, "")
    options = agent_pb2.AgentOptions(
        provider=profile.provider or inherited.provider,
        model=profile.model or ("" if profile.provider else inherited.model),
        persona=profile.persona or inherited.persona,
    )
    if profile.tools is None:
        tools = list(inherited.tools)
    else:
        tools = [tool for tool in profile.tools if tool in parent.tools]
    tools += [tool for tool in profile.grant_tools if tool not in tools]
    options.tools.extend(tools)
    required = profile.approval_required_tools
    options.approval_required_tools.extend(
        inherited.approval_required_tools if required is None else required
    )
    if profile.approval_timeout_seconds is not None:
        options.approval_timeout.FromNanoseconds(int(profile.approval_timeout_seconds * 1e9))
    elif inherited.HasField("approval_timeout"):
        options.approval_timeout.CopyFrom(inherited.approval_timeout)
    if profile.max_parallel_tool_calls is not None:
        options.max_parallel_tool_calls = profile.max_parallel_tool_calls
    return options


def answer_of(agent: Agent) -> tuple[str, str, int]:
    """The child's last turn: its final text, how it ended, and its steps."""
    text, ending, steps = "", "", 0
    for event in reversed(agent.session.events):
        kind = event.WhichOneof("payload")
        if kind == "turn_end" and not ending:
            ending = event.turn_end.reason.WhichOneof("kind") or "unknown"
        elif kind == "assistant_message":
            steps = max(steps, event.assistant_message.step)
            text = text or plain_text(event.assistant_message.content)
        elif kind == "turn_start":
            break
    return text, ending, steps


class Delegation:
    """The bodies of the two tools."""

    def __init__(self, factory: AgentFactory, profiles: Mapping[str, SubagentProfile]) -> None:
        self.factory = factory
        self.profiles = profiles

    async def delegate(self, exec: ToolExecution) -> ToolReturn:
        """Create a child with the task; answer with its final text, or its id."""
        args = _object(exec)
        task, mode, profile = (
            args.get("task"),
            args.get("mode", "foreground"),
            args.get("profile", ""),
        )
        if not isinstance(task, str) or not task.strip():
            raise ToolArgumentsError(f'{DELEGATE}: "task" must be a non-empty string')
        if mode not in MODES:
            raise ToolArgumentsError(f'{DELEGATE}: "mode" must be "foreground" or "background"')
        if not isinstance(profile, str):
            raise ToolArgumentsError(f'{DELEGATE}: "profile" must be a string')
        exec.signal.raise_if_aborted()
        parent = self.factory.get(exec.agent_id)
        child_id = self._child_id(exec.agent_id, exec.call_id)
        try:
            child = await self.factory.create(
                child_id,
                child_options(parent.options, profile, self.profiles),
                cwd=parent.session.header.cwd,
                parent=fac.AgentParent(agent_id=exec.agent_id, tool_call_id=exec.call_id),
            )
        except AgentLoopError as error:
            return ToolReturn(f"Error: {DELEGATE}: {error}", is_error=True)
        child.session.committed_observers.append(Progress(parent, child, exec.call_id))
        child.subscribe(Bubble(parent))  # its own children's reports go up the tree
        source = c.Source(kind="agent", name=exec.agent_id)  # the parent asked
        child.send([c.ContentBlock(text=c.TextBlock(text=task))], source)
        if mode == "background":
            return ToolReturn(
                f"Started sub-agent {child_id}; collect its answer with {COLLECT}.",
                meta=_meta(child, "running"),
            )
        return await self._finish(exec, child)

    def _child_id(self, parent: str, call_id: str) -> str:
        """`<parent>.<call id>`: predictable (a script can collect it); else made unique."""
        suffix = "." + re.sub(r"[^A-Za-z0-9._:-]", "-", call_id)[:32]
        if len(suffix) == 1 or parent[: MAX_ID - len(suffix)] + suffix in self.factory.held():
            suffix = f".sub-{uuid.uuid4().hex[:12]}"
        return parent[: MAX_ID - len(suffix)] + suffix

    async def collect(self, exec: ToolExecution) -> ToolReturn:
        """A background child's answer (then it is disposed), or its progress so far."""
        args = _object(exec)
        child_id, wait = args.get("agent_id"), args.get("wait", True)
        if not isinstance(child_id, str) or not isinstance(wait, bool):
            raise ToolArgumentsError(f'{COLLECT}: "agent_id" must be a string, "wait" a boolean')
        link = self.factory.family.link(child_id)
        child = self.factory.agents.get(child_id)
        if link is None or link.parent != exec.agent_id or child is None:
            return ToolReturn(
                f'Error: {COLLECT}: "{child_id}" is not a live sub-agent of this agent',
                is_error=True,
            )
        if not wait and not child.is_idle():
            text, _, steps = answer_of(child)
            progress = f"Sub-agent {child_id} is still running ({steps} step(s) so far)."
            return ToolReturn(
                progress + (f" Latest: {text}" if text else ""), meta=_meta(child, "running")
            )
        return await self._finish(exec, child)

    async def _finish(self, exec: ToolExecution, child: Agent) -> ToolReturn:
        """Wait for the child's turn (cancelled with the parent's step), answer, dispose."""
        try:
            await exec.signal.race(child.when_idle())
        except Aborted:
            if not child.disposed:
                child.cancel("parent cancelled")
            await self.factory.teardown(child)
            raise
        text, ending, steps = answer_of(child)
        await self.factory.teardown(child)
        meta = _meta(child, ending)
        meta["steps"] = steps
        if ending != "completed":
            return ToolReturn(
                f"Error: sub-agent {child.agent_id} ended {ending}: {text}",
                is_error=True,
                meta=meta,
            )
        return ToolReturn(text, meta=meta)


class Progress:
    """Reports each step and the turn end of a child on its parent's live events."""

    def __init__(self, parent: Agent, child: Agent, call_id: str) -> None:
        self.parent = parent
        self.child = child
        self.call_id = call_id
        self.text = ""

    def __call__(self, event: ev.SessionEvent) -> None:
        """Called with each stored event of the child's session."""
        kind = event.WhichOneof("payload")
        if kind == "assistant_message":
            self.text = plain_text(event.assistant_message.content)[:PROGRESS_TEXT] or self.text
        elif kind == "step_end":
            self._report(event.step_end.step, "running")
        elif kind == "turn_end":
            self._report(0, event.turn_end.reason.WhichOneof("kind") or "unknown")

    def _report(self, step: int, state: str) -> None:
        if self.parent.disposed:
            return
        progress = ae.ChildProgress(
            child_agent_id=self.child.agent_id,
            child_session_id=self.child.session.session_id,
            tool_call_id=self.call_id,
            step=step,
            state=state,
            text=self.text,
            parent_agent_id=self.parent.agent_id,
        )
        self.parent.emit(None, None, ae.AgentEvent(child_progress=progress))


class Bubble:
    """Passes a child's reports of its own children up to its parent, as they come."""

    def __init__(self, parent: Agent) -> None:
        self.parent = parent

    def __call__(self, event: ae.AgentEvent) -> None:
        """Called with each live event of the child."""
        if event.HasField("child_progress") and not self.parent.disposed:
            report = ae.AgentEvent(child_progress=event.child_progress)
            self.parent.emit(None, None, report)


def _meta(child: Agent, state: str) -> dict[str, object]:
    return {"agent_id": child.agent_id, "session_id": child.session.session_id, "state": state}


def _object(exec: ToolExecution) -> dict[str, object]:
    if not isinstance(exec.arguments, dict):
        raise ToolArgumentsError(f"{exec.name}: the arguments must be a JSON object")
    return exec.arguments
