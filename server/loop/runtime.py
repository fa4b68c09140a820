"""The services an agent runs on, bundled: seams, tools, models, prompts, storage."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from server.kernel.defaults import (
    DEFAULT_PROVIDER,
    MAX_PARALLEL_TOOL_CALLS,
    PLUGIN_TIMEOUT_SECONDS,
)
from server.kernel.limits import Limits
from server.kernel.seams import SeamRegistry
from server.kernel.tokens import DEFAULT_KEEP_RECENT, DEFAULT_OUTPUT_RESERVE
from server.kernel.tools import ToolRegistry
from server.loop.system_prompt import SystemPrompt, default_system_prompt
from server.models import ModelRegistry
from server.sessions.journal import Journal
from server.sessions.persistence import Persistence
from server.sessions.requests import Requests
from server.sessions.session import WINDOW
from server.stores import SessionStore
from server.stores.memory import MemoryStore

DEFAULT_MAX_PARALLEL_TOOL_CALLS = MAX_PARALLEL_TOOL_CALLS


@dataclass
class Runtime:
    """Everything the loop depends on; one per server (or per test)."""

    seams: SeamRegistry = field(default_factory=SeamRegistry)
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    models: ModelRegistry = field(default_factory=ModelRegistry)
    prompts: SystemPrompt = field(default_factory=default_system_prompt)
    store: SessionStore = field(default_factory=MemoryStore)
    limits: Limits = field(default_factory=Limits)
    """The server's size and count limits."""
    max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS
    """The server-wide cap on parallel tool calls per step; agents may set their own."""
    default_provider: str = DEFAULT_PROVIDER
    """The provider of agents that name none."""
    plugin_timeout: float = PLUGIN_TIMEOUT_SECONDS
    """Seconds a plugin call waits for its result when neither plugin nor operator set it."""
    event_window: int = WINDOW
    """Recent events each session keeps in memory; older ones are read from the store."""
    approval_timeout: float = 300.0
    """Seconds a tool call waits for approval unless its agent sets its own; 0: no approvals."""
    context_windows: dict[str, int] = field(default_factory=dict)
    """Context windows by provider name, from config (a model's own comes from the table)."""
    output_reserve: int = DEFAULT_OUTPUT_RESERVE
    """Tokens kept free for the output unless the agent sets its own."""
    keep_recent: int = DEFAULT_KEEP_RECENT
    """Recent history a compaction keeps verbatim unless the agent sets its own."""
    tool_order: list[str] | None = None
    """The canonical tool order, with one "<unlisted-tools>" marker; None is by name."""
    until_acting: Callable[[], Awaitable[None]] | None = None
    """Waits while this server must not act for its agents (a replica whose lease
    renewal is late); each step waits here before it begins. None: always acting."""
    journal: Journal = field(init=False)
    """The write-ahead path to the store: group commits, then publication."""
    requests: Requests = field(init=False)
    persistence: Persistence = field(init=False)

    def __post_init__(self) -> None:
        self.journal = Journal(self.store)
        self.requests = Requests(self.store)
        self.persistence = Persistence(self.seams)
