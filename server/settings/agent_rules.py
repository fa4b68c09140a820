"""What makes an agent valid: one set of rules for config agents and `CreateAgent`.

A config agent (YAML) and an agent created or resumed over gRPC pass the same checks,
with the same messages: each rule returns the problem, and the caller names the field
its own way (`agents[0].tools` in a config, `options.tools` in a request).

Names (providers, tools) must be registered with the server when the agent is created:
built-ins, configured providers, and whatever a plugin registers. A config without
plugins knows the whole registry when it is read, so its agents are checked then; with
plugins, the names a plugin brings are known only at start, where the same check runs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

from agentloop.v1 import agent_pb2
from server.kernel.errors import CodedError, InvalidArgument
from server.kernel.limits import Limits
from server.loop.system_prompt import PERSONA_VARIABLES, interpolate
from server.loop.validation import check_agent_options
from server.models.scripted_options import options_type


def cwd_problem(cwd: str) -> str:
    """A working directory is absolute (or absent)."""
    return f"{cwd!r} must be an absolute path" if cwd and not cwd.startswith("/") else ""


def cap_problem(cap: int) -> str:
    """A parallel tool-call cap is a positive integer."""
    return "" if cap >= 1 else f"must be a positive integer, not {cap!r}"


def provider_problem(provider: str, known: Collection[str]) -> str:
    """A provider is one the server knows."""
    if provider in known:
        return ""
    return f"{provider!r} is not a provider (known: {', '.join(known)})"


def tools_problem(tools: Iterable[str], known: Collection[str], what: str = "tool") -> str:
    """Every tool is one the server knows; the problem names the first that is not."""
    for tool in tools:
        if tool not in known:
            return f"{tool!r} is not a {what} (known: {', '.join(sorted(known))})"
    return ""


def persona_problem(persona: str, values: dict[str, str | None]) -> str:
    """A persona uses only the prompt variables, and only those with a value here."""
    try:
        interpolate(persona, values)
    except CodedError as error:
        if str(error).startswith("unknown prompt variable"):
            return f"{error} (known: {', '.join(PERSONA_VARIABLES)})"
        return str(error)
    return ""


MAX_LABELS = 32
LABEL_KEY = re.compile(r"[A-Za-z0-9._/-]{1,63}")
MAX_LABEL_VALUE_CHARS = 256


def labels_problem(labels: Mapping[str, str]) -> str:
    """Labels are few, with short keys of a plain alphabet and short values."""
    if len(labels) > MAX_LABELS:
        return f"{len(labels)} labels (at most {MAX_LABELS})"
    for key, value in sorted(labels.items()):
        if not LABEL_KEY.fullmatch(key):
            return f"key {key!r} must be 1-63 letters, digits, '.', '_', '/', '-'"
        if len(value) > MAX_LABEL_VALUE_CHARS:
            return f"the value of {key!r} is longer than {MAX_LABEL_VALUE_CHARS} characters"
    return ""


class AgentCatalogue:
    """What agent options are checked against: the providers and tools registered now."""

    def __init__(
        self,
        providers: Collection[str],
        tools: Collection[str],
        default_provider: str,
        limits: Limits,
    ) -> None:
        self.providers = providers
        self.tools = tools
        self.default_provider = default_provider
        self.limits = limits

    def check(self, options: agent_pb2.AgentOptions, provider_options_type: str) -> None:
        """Refuse options the server cannot run, naming the field (`options.*`).

        `provider_options_type` is the options message the chosen provider takes ("" for
        none).
        """
        if options.HasField("max_parallel_tool_calls"):
            _raise("options.max_parallel_tool_calls", cap_problem(options.max_parallel_tool_calls))
        _raise("options.provider", provider_problem(self.provider_of(options), self.providers))
        given = options_type(options)
        if given and given != provider_options_type:
            takes = (
                f"takes {provider_options_type}"
                if provider_options_type
                else "takes no provider options"
            )
            raise InvalidArgument(
                "options.provider_options",
                f'provider "{self.provider_of(options)}" {takes}, not {given}',
            )
        _raise("options.tools", tools_problem(options.tools, self.tools, "registered tool"))
        _raise("options.labels", labels_problem(options.labels))
        check_agent_options(self.limits, options)

    def provider_of(self, options: agent_pb2.AgentOptions) -> str:
        """The provider the agent runs on: its own, else the server's default."""
        return options.provider or self.default_provider


def check_persona(options: agent_pb2.AgentOptions, provider: str, model: str, cwd: str) -> None:
    """Refuse a persona using a variable this agent will have no value for.

    Checked against the agent's own values: a `{{cwd}}` persona for an agent without a
    working directory would otherwise fail every turn.
    """
    if options.persona:
        values = {"provider": provider, "model": model, "cwd": cwd}
        assert set(values) == set(PERSONA_VARIABLES)
        _raise(
            "options.persona",
            persona_problem(options.persona, {k: v or None for k, v in values.items()}),
        )


def _raise(field: str, problem: str) -> None:
    if problem:
        raise InvalidArgument(field, problem)
