"""System prompt assembly: ordered sections, strict `{{name}}` variables, one rendered string.

Each step the loop asks `SystemPrompt.assemble` for the sections visible to the agent and
the values of the registered variables, lets the `system-prompt/assemble` waterfall rewrite
that `Assembly`, and renders the result:

- sections are sorted by order (stably) and each one is interpolated;
- a reference is a complete `{{name}}` with `name` matching `[a-z][a-z0-9_]*`;
- an unknown name, a variable without a value, or a malformed `{{...}}` group is an error
  (`CodedError` with code `PROMPT_VARIABLE`); a lone `{{` with no later `}}` is literal;
- substituted values are not scanned again;
- empty results are dropped and the rest joined with a blank line; all empty gives "".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from server.kernel.errors import CodedError
from server.kernel.prompt import Assembly, Section
from server.kernel.seams import SYSTEM_PROMPT_ASSEMBLE, SeamRegistry

PROMPT_VARIABLE = "PROMPT_VARIABLE"
"""The error code of every render failure."""

IDENTITY_TEXT = "You are an AI agent hosted by agentloop."
"""The text of the built-in `identity` section."""

_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class PromptScope:
    """What variable resolvers read: the agent being assembled for."""

    agent_id: str
    """The agent."""
    provider: str = ""
    """The agent's model provider, empty when unknown."""
    model: str = ""
    """The agent's model, empty when unknown."""
    cwd: str = ""
    """The session's working directory, empty when it has none."""


Resolver = Callable[[PromptScope], str | None]
"""Computes a variable's value for one assembly; None means "no value"."""


T = TypeVar("T")


@dataclass(eq=False)
class _Entry(Generic[T]):
    """A registration of a section or a variable, global or scoped to one agent."""

    name: str
    agent_id: str | None
    value: T
    scope_only: bool = False
    """A variable whose value depends on the `PromptScope` alone (the same scope, the
    same value): a prompt made only of such variables is rendered once per scope."""


class SystemPrompt:
    """The registered sections and variables, and the assemble/render steps."""

    def __init__(self) -> None:
        # Registration order is kept: it breaks ties in render order, and among
        # registrations of one name in one scope the latest wins.
        self._sections: list[_Entry[Section]] = []
        self._variables: list[_Entry[Resolver]] = []
        self._rendered: dict[PromptScope, str] = {}
        """Prompts rendered with no assemble listener and scope-only variables, per
        scope; emptied by any change of sections or variables."""

    def add_section(self, section: Section, agent_id: str | None = None) -> Callable[[], None]:
        """Register `section`, globally or for one agent.

        Args:
            section: The section to add.
            agent_id: Scope the section to this agent; it then shadows a global section of
                the same name for that agent only.

        Returns:
            A disposer that removes this registration (calling it again does nothing).
        """
        entry = _Entry(section.name, agent_id, section)
        self._sections.append(entry)
        self._rendered.clear()
        return self._disposer(self._sections, entry)

    def add_variable(
        self,
        name: str,
        resolver: Resolver,
        agent_id: str | None = None,
        *,
        scope_only: bool = False,
    ) -> Callable[[], None]:
        """Register the variable `name`, computed by `resolver` at each assembly.

        Args:
            name: The variable name; must match `[a-z][a-z0-9_]*`.
            resolver: Called with the agent's `PromptScope`; returns the value or None.
            agent_id: Scope the variable to this agent, shadowing a global one.
            scope_only: The resolver's value depends on its `PromptScope` alone: a
                prompt whose variables all do is not assembled again for the same scope
                while nothing changes (no `system-prompt/assemble` listener, no
                registration). Otherwise it is called at every assembly.

        Returns:
            A disposer that removes this registration.

        Raises:
            ValueError: The name cannot be referenced from a template.
        """
        if not _NAME.fullmatch(name):
            raise ValueError(f'invalid prompt variable name "{name}"')
        entry = _Entry(name, agent_id, resolver, scope_only)
        self._variables.append(entry)
        self._rendered.clear()
        return self._disposer(self._variables, entry)

    def remove_agent(self, agent_id: str) -> None:
        """Drop every section and variable scoped to `agent_id`."""
        # In place: disposers hold a reference to these lists.
        self._sections[:] = [e for e in self._sections if e.agent_id != agent_id]
        self._variables[:] = [e for e in self._variables if e.agent_id != agent_id]
        self._rendered.clear()

    def sections_for(self, agent_id: str) -> list[Section]:
        """The sections `agent_id` sees, in registration order, after shadowing."""
        return [e.value for e in _visible(self._sections, agent_id)]

    async def assemble(self, scope: PromptScope, seams: SeamRegistry) -> Assembly:
        """Collect sections and variable values, then run the assemble waterfall.

        Args:
            scope: The agent being assembled for; passed to every resolver.
            seams: Where `system-prompt/assemble` listeners are registered.

        Returns:
            The waterfall's result, which is authoritative.

        Raises:
            CodedError: A listener returned something other than an `Assembly`.
        """
        assembly, _ = self._collect(scope)
        result = await seams.waterfall(
            SYSTEM_PROMPT_ASSEMBLE, scope.agent_id, lambda: assembly, assembly
        )
        if not isinstance(result, Assembly):
            raise CodedError(
                f"{SYSTEM_PROMPT_ASSEMBLE} returned {type(result).__name__}, not an Assembly",
                PROMPT_VARIABLE,
            )
        return result

    @staticmethod
    def render(assembly: Assembly) -> str:
        """Render `assembly` into the system prompt; see `render`."""
        return render(assembly)

    async def system_text(self, scope: PromptScope, seams: SeamRegistry) -> str:
        """`assemble`, then `render`: the system prompt of one step.

        Without an assemble listener for the agent and with scope-only variables, the
        same scope renders the same text: it is rendered once, not at every step.
        """
        if seams.has(SYSTEM_PROMPT_ASSEMBLE, scope.agent_id):
            return render(await self.assemble(scope, seams))
        text = self._rendered.get(scope)
        if text is None:
            assembly, scope_only = self._collect(scope)
            text = render(assembly)
            if scope_only:
                self._rendered[scope] = text
        return text

    def _collect(self, scope: PromptScope) -> tuple[Assembly, bool]:
        """The sections and variables `scope` sees, and whether all are scope-only."""
        variables: dict[str, str | None] = {}
        scope_only = True
        for entry in _visible(self._variables, scope.agent_id):
            variables[entry.name] = entry.value(scope)
            scope_only = scope_only and entry.scope_only
        return Assembly(self.sections_for(scope.agent_id), variables), scope_only

    def _disposer(self, entries: list[_Entry[T]], entry: _Entry[T]) -> Callable[[], None]:
        def dispose() -> None:
            # Identity, not equality: two registrations may carry equal sections.
            for i, e in enumerate(entries):
                if e is entry:
                    del entries[i]
                    self._rendered.clear()
                    return

        return dispose


def _visible(entries: list[_Entry[T]], agent_id: str) -> list[_Entry[T]]:
    """The entries `agent_id` sees: per name the latest scoped one, else the latest global."""
    chosen: dict[str, _Entry[T]] = {}
    for e in entries:
        if e.agent_id is None:
            current = chosen.get(e.name)
            if current is None or current.agent_id is None:
                chosen[e.name] = e
        elif e.agent_id == agent_id:
            chosen[e.name] = e
    # Keep registration order so that equal orders render predictably.
    picked = set(map(id, chosen.values()))
    return [e for e in entries if id(e) in picked]


def interpolate(template: str, variables: dict[str, str | None]) -> str:
    """Substitute every `{{name}}` in `template` with its value, strictly.

    Args:
        template: The text to interpolate.
        variables: The known variables; None marks a variable without a value.

    Returns:
        The interpolated text. Substituted values are not scanned again.

    Raises:
        CodedError: With code `PROMPT_VARIABLE`, for an unknown name, a variable without a
            value, or a malformed group (a `{{` whose first later `}}` does not enclose a
            valid name).
    """
    # One left-to-right pass with str.find: linear in the template's length. A group runs
    # from a `{{` to the first `}}` after it; when no `}}` follows a `{{`, none follows any
    # later `{{` either, so the rest is literal (a lazy regex rescans it per `{{`: quadratic).
    parts: list[str] = []
    pos = 0
    while True:
        start = template.find("{{", pos)
        if start < 0:
            break
        end = template.find("}}", start + 2)
        if end < 0:
            break
        parts.append(template[pos:start])
        parts.append(_value(template[start + 2 : end], variables))
        pos = end + 2
    if not parts:
        return template
    parts.append(template[pos:])
    return "".join(parts)


def _value(name: str, variables: dict[str, str | None]) -> str:
    """The value of the reference `{{name}}`; `CodedError` when it has none."""
    if not _NAME.fullmatch(name):
        shown = name if len(name) <= 40 else f"{name[:40]}..."  # a hostile group can be huge
        raise CodedError(f'malformed prompt variable reference "{{{{{shown}}}}}"', PROMPT_VARIABLE)
    if name not in variables:
        raise CodedError(f'unknown prompt variable "{name}"', PROMPT_VARIABLE)
    value = variables[name]
    if value is None:
        raise CodedError(
            f'prompt variable "{name}" has no value for this assembly', PROMPT_VARIABLE
        )
    return value


def render(assembly: Assembly) -> str:
    """Render `assembly`: sort by order (stable), interpolate, drop empties, join.

    Args:
        assembly: The sections and variables to render.

    Returns:
        The non-empty interpolated sections joined with a blank line, or "" when every
        section renders empty (the request then omits `system`).

    Raises:
        CodedError: A variable reference failed; see `interpolate`.
    """
    parts = (
        interpolate(s.text, assembly.variables)
        for s in sorted(assembly.sections, key=lambda s: s.order)
    )
    return "\n\n".join(p for p in parts if p)


def persona_section(text: str) -> Section:
    """The per-agent `persona` section (order 0), to be added scoped to the agent."""
    return Section("persona", 0, text)


PERSONA_VARIABLES = ("provider", "model", "cwd")
"""The variables every agent's prompt may use; the loop resolves them per step."""


def default_system_prompt() -> SystemPrompt:
    """A `SystemPrompt` with the built-in `identity` section and the scope variables.

    The variables are `provider`, `model` and `cwd`. An empty scope field resolves to None,
    so that a template using, say, `{{cwd}}` for an agent without a working directory fails
    clearly instead of rendering a blank.
    """
    prompt = SystemPrompt()
    prompt.add_section(Section("identity", -100, IDENTITY_TEXT))
    prompt.add_variable("provider", lambda s: s.provider or None, scope_only=True)
    prompt.add_variable("model", lambda s: s.model or None, scope_only=True)
    prompt.add_variable("cwd", lambda s: s.cwd or None, scope_only=True)
    return prompt
