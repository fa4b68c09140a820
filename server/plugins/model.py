"""Plugin models: a model provider served by a plugin, each call streamed through `Handle`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import stream_pb2 as st
from server.kernel.abort import AbortSignal
from server.kernel.errors import TurnFatal
from server.models import ModelRequest
from server.models.appended import SLICE_BYTES, SLICE_MESSAGES, Appended, in_slices, split
from server.observability import observe
from server.plugins.calls import PluginCaller, PluginCallFailed, PluginStats, call_ids
from server.plugins.wire import message_entry

MODEL_TIMEOUT = 60.0
"""Seconds a plugin model may stay silent between two chunks, by default."""


class EncodedMessages:
    """One agent's history as `ModelStreamCall.messages` entries, extended per request.

    Why the kept bytes are never stale, and what they cost: `server.models.appended`.
    """

    __slots__ = ("_appended", "_entries")

    def __init__(self) -> None:
        self._appended = Appended()
        self._entries = bytearray()

    @property
    def kept(self) -> int:
        """How many history messages it holds the entries of (grows a slice at a time)."""
        return self._appended.count

    def entries(self, messages: Sequence[c.Message]) -> list[bytes | bytearray]:
        """The encoded entries of `messages`: the prefix's afresh, the history's as kept.

        The kept bytes grow at the next request: they are copied into the call at once.
        """
        prefix, items, length = split(messages)
        restart, new = self._appended.advance(items, length)
        if restart:
            self._entries = bytearray()
        for message in new:
            self._entries += message_entry(message)
        return [*(message_entry(message) for message in prefix), self._entries]

    async def entries_in_slices(
        self, messages: Sequence[c.Message], signal: AbortSignal
    ) -> list[bytes | bytearray]:
        """`entries`, the new history messages encoded a slice at a time (`in_slices`).

        Raises:
            Aborted: When `signal` fires between two slices (a cancel of the task stops
                it there too); what was kept is exact, the next call goes on from it.
        """
        _, items, length = split(messages)

        def extend(start: int) -> int:
            end = min(length, start + SLICE_MESSAGES)
            encoded: list[bytes] = []
            size = 0
            stop = start
            while stop < end and size < SLICE_BYTES:
                entry = message_entry(items[stop])
                encoded.append(entry)
                size += len(entry)
                stop += 1
            restart, _ = self._appended.advance(items, stop)  # those of `encoded`
            if restart:
                self._entries = bytearray()
            self._entries += b"".join(encoded)
            return stop

        await in_slices(self._appended, items, length, None, extend, signal)
        return self.entries(messages)  # the prefix; the rest, after another's call


class PluginModel:
    """A model provider served by a plugin: each call streams through `Handle`."""

    def __init__(
        self,
        plugin: str,
        definition: hk.ModelProviderDefinition,
        caller: PluginCaller,
        stats: PluginStats,
    ) -> None:
        self.plugin = plugin
        self.provider = definition.provider
        self.caller = caller
        self.stats = stats
        self.timeout = (
            definition.timeout.ToNanoseconds() / 1e9
            if definition.HasField("timeout")
            else MODEL_TIMEOUT
        )
        self._histories: dict[str, EncodedMessages] = {}
        """Per agent, its history's encoded entries as sent, extended per request."""

    def release(self, agent_id: str) -> None:
        """Drop the kept history of `agent_id` (the agent was disposed)."""
        self._histories.pop(agent_id, None)

    async def stream(
        self, request: ModelRequest, signal: AbortSignal
    ) -> AsyncIterator[st.StreamChunk]:
        """Stream one model call from the plugin; a failure is a coded turn error."""
        call = hk.HookCall(
            call_id=f"m{next(call_ids)}",
            kind=hk.CALL_KIND_MODEL_STREAM,
            agent_id=request.agent_id,
            session_id=request.session_id,
            turn=request.turn,
            step=request.step,
            # The messages go as bytes, from the agent's kept history (`EncodedMessages`).
            model_stream=hk.ModelStreamCall(provider=self.provider, header=request.header),
        )
        history = self._histories.get(request.agent_id)
        if history is None:
            history = self._histories[request.agent_id] = EncodedMessages()
        # A long backlog (a first call) is encoded in slices, other tasks running between.
        messages = await history.entries_in_slices(request.messages, signal)
        call.timeout.FromNanoseconds(int(self.timeout * 1e9))
        try:
            # Closed with this generator, so an early stop withdraws the call at once.
            with observe.plugin_call_scope(
                self.plugin, "model/stream", request.agent_id, request.turn, request.step, call
            ):
                async with contextlib.aclosing(
                    self.caller.stream(call, self.timeout, signal, messages)
                ) as chunks:
                    async for chunk in chunks:
                        yield chunk
        except PluginCallFailed as failure:
            self.stats.errors += failure.kind != "timeout"
            raise TurnFatal(
                f'plugin "{self.plugin}" model {self.provider}: {failure.kind}: {failure}',
                f"PLUGIN_{failure.kind.upper()}",
            ) from None
