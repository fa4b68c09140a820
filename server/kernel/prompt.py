"""What the `system-prompt/assemble` seam passes along: sections and variables.

The data of the seam, below the loop's `SystemPrompt` that registers, assembles and
renders them (`server/loop/system_prompt.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Section:
    """One named block of the system prompt."""

    name: str
    """Identifies the section; a scoped section shadows a global one of the same name."""
    order: int
    """Sort key; lower comes first (identity is -100, persona 0, tool guidance 100-199)."""
    text: str
    """The template text, which may reference variables as `{{name}}`."""


@dataclass
class Assembly:
    """The value of the `system-prompt/assemble` waterfall: what will be rendered."""

    sections: list[Section] = field(default_factory=list)
    """The visible sections, in registration order (render sorts them)."""
    variables: dict[str, str | None] = field(default_factory=dict)
    """Every known variable; None means registered but without a value for this agent."""
