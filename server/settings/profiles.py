"""Sub-agent profiles of the server config: what a `delegate` child named by one runs with.

A profile names a provider, a model, a persona (the child's system prompt section),
tools and an approval policy. Its `tools` are a ceiling, not a grant: a child gets
those its parent has (never a tool its parent lacks); `grantTools` are the tools the
profile gives even to a child whose parent lacks them. What a profile leaves unset is
the parent's. An agent's own `AgentOptions.subagent_profiles` win over these by name.
"""

from __future__ import annotations

from typing import Annotated

from pydantic.dataclasses import dataclass

from server.kernel.ids import id_problem
from server.kernel.schema import SCHEMA, PositiveInt, rule
from server.settings.fields import NonNegativeSeconds, Text

ProfileName = Annotated[Text, rule(id_problem)]
ProfileTimeout = Annotated[
    NonNegativeSeconds,
    rule(lambda s: "" if 0 < s <= 86400 else "must be a number above 0, at most 86400"),
]
"""As `AgentOptions.approval_timeout`: positive (approvals are turned off server-wide)."""


@dataclass(frozen=True, config=SCHEMA)
class SubagentProfile:
    """A named set of options for the children `delegate` makes with `profile: NAME`."""

    name: ProfileName
    """The name `delegate`'s `profile` argument gives."""
    provider: Text = ""
    """The child's provider; empty: the parent's."""
    model: Text = ""
    """The child's model; empty: the parent's when the provider is too, else the provider's."""
    persona: Text = ""
    """The persona section of the child's system prompt; empty: the parent's."""
    tools: tuple[Text, ...] | None = None
    """The tools the child may have, of those its parent has; unset: all the parent's
    (less `delegate` and `collect`)."""
    grant_tools: tuple[Text, ...] = ()
    """Tools the child gets even when its parent lacks them."""
    approval_required_tools: tuple[Text, ...] | None = None
    """Tools whose every call waits for approval; unset: the parent's."""
    approval_timeout_seconds: ProfileTimeout | None = None
    """How long the child's calls wait for approval; unset: the parent's."""
    max_parallel_tool_calls: PositiveInt | None = None
    """The child's parallel tool-call cap; unset: the server's."""
