"""Models: the small protocol a provider implements, and the registry that picks one.

A provider turns one frozen `ModelRequest` into a stream of `StreamChunk`s: block
starts, deltas and ends, then usage, then exactly one finish. It must stop promptly
when the signal aborts (raising `Aborted`, or simply returning).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agentloop.v1 import agent_pb2, content_pb2, stream_pb2
from server.kernel.abort import AbortSignal
from server.kernel.errors import CodedError


@dataclass(frozen=True)
class ModelRequest:
    """One model call: the header fields and the history, frozen."""

    agent_id: str
    """The calling agent."""
    session_id: str
    """The agent's session."""
    turn: int
    """The turn number."""
    step: int
    """The step number within the turn."""
    header: content_pb2.RequestHeader
    """Config, system prompt, tools and message prefix. Do not mutate."""
    messages: Sequence[content_pb2.Message]
    """The message prefix followed by the derived history: a frozen view (see
    `server.kernel.history`), taken without copying the history. Do not mutate."""
    options: agent_pb2.AgentOptions
    """The agent's creation options (the scripted provider reads its script here)."""
    purpose: str = ""
    """"" for a step's request; "compaction" for a summary request (`server.loop.compaction`):
    its one user message holds the transcript to summarise."""


class Model(Protocol):
    """A model provider."""

    def stream(
        self, request: ModelRequest, signal: AbortSignal
    ) -> AsyncIterator[stream_pb2.StreamChunk]:
        """Stream the chunks of one model call."""
        ...


class ModelRegistry:
    """Providers by name."""

    def __init__(self) -> None:
        self._providers: dict[str, Model] = {}
        self._default_models: dict[str, str] = {}

    def register(self, name: str, model: Model, default_model: str = "") -> Callable[[], None]:
        """Add a provider, with the model agents get when they name none; returns a remover.

        A provider without a default model needs one from the agent options or from an
        `agent/request` listener. A second registration of one name is refused.
        """
        if name in self._providers:
            raise ValueError(f'model provider "{name}" is already registered')
        self._providers[name] = model
        self._default_models[name] = default_model

        def remove() -> None:
            if self._providers.get(name) is model:
                del self._providers[name]
                del self._default_models[name]

        return remove

    def release(self, agent_id: str) -> None:
        """Drop what any provider keeps for `agent_id` (the agent was disposed)."""
        for model in self._providers.values():
            release = getattr(model, "release", None)
            if release is not None:
                release(agent_id)

    async def aclose(self) -> None:
        """Close what the providers hold open (pooled connections); at server stop."""
        for model in self._providers.values():
            aclose = getattr(model, "aclose", None)
            if aclose is not None:
                await aclose()

    def default_model(self, name: str) -> str:
        """The default model of provider `name`; empty when it has none."""
        return self._default_models.get(name, "")

    def names(self) -> list[str]:
        """The registered provider names, sorted."""
        return sorted(self._providers)

    def get(self, name: str) -> Model:
        """The provider called `name`; a coded error if there is none."""
        model = self._providers.get(name)
        if model is None:
            known = ", ".join(self.names()) or "none"
            raise CodedError(
                f'unknown model provider "{name}" (registered: {known})', "UNKNOWN_PROVIDER"
            )
        return model
