"""The session log: an append-only list of `SessionEvent`s and the history derived from it.

Appends are synchronous. Each one gets the next sequence number and the time, passes
the pre-commit checks (surface rules, a `pre_commit` veto), is committed, and is then
published to the observers, whose failures are contained. An append from inside an
observer is refused: observers must defer, or use other channels.

History is a projection of the surface events, kept incrementally so that deriving it
costs one list copy per step, not a pass over the whole log.
"""

from __future__ import annotations

import asyncio
import html
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import timestamp_pb2

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from agentloop.v1 import session_pb2

log = logging.getLogger(__name__)

SURFACE_KINDS = frozenset(
    {"user_message", "assistant_message", "tool_result", "context_message", "steering_message"}
)
"""The payload kinds that produce history."""

APPEND = ev.SurfaceOp(kind=ev.SURFACE_OP_KIND_APPEND)

Observer = Callable[[ev.SessionEvent], Any]


class ReentrantAppend(RuntimeError):
    """An observer tried to append while an append was being published."""


def now_timestamp() -> timestamp_pb2.Timestamp:
    """The current time as a protobuf Timestamp."""
    ns = time.time_ns()
    return timestamp_pb2.Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


class SessionLog:
    """One session: its header, its events, its derived history and its folded header."""

    def __init__(
        self,
        session_id: str,
        header: session_pb2.SessionHeader,
        seed: Sequence[ev.SessionEvent] = (),
    ) -> None:
        self.session_id = session_id
        self.header = header
        self.events: list[ev.SessionEvent] = []
        self.observers: list[Observer] = []
        """Called after each commit; failures are logged and contained."""
        self.pre_commit: list[Observer] = []
        """Called before each commit; a throw vetoes the append."""
        self.agent_id = ""
        """The live agent driving this session, if any."""
        self.max_turn = 0
        self.open_turn = 0
        """The turn whose `turn/start` is the last boundary; 0 when none is open."""
        self.request_header: c.RequestHeader | None = None
        """The latest logged request header (the fold: the latest snapshot wins)."""
        self._history: list[c.Message] = []
        self._surface: list[c.Message | None] = []
        self._publishing = False
        self._waiters: list[asyncio.Future[None]] = []
        self.observer_failures = 0
        for event in seed:
            self._commit(event)

    def __len__(self) -> int:
        return len(self.events)

    def append(
        self,
        kind: str,
        payload: Any,
        *,
        source_event_seqs: Sequence[int] = (),
    ) -> ev.SessionEvent:
        """Append one event whose payload field is `kind`; returns the committed event."""
        if self._publishing:
            raise ReentrantAppend(
                "session append cannot reenter while another append is being published"
            )
        event = ev.SessionEvent(seq=len(self.events), time=now_timestamp(), **{kind: payload})
        if kind in SURFACE_KINDS:
            event.surface_op.CopyFrom(APPEND)
            event.source_event_seqs.extend(source_event_seqs)
        elif source_event_seqs:
            raise ValueError(f"{kind} is not a surface event and takes no source_event_seqs")
        for check in self.pre_commit:
            check(event)
        self._commit(event)
        self._publish(event)
        return event

    def derive_messages(self) -> list[c.Message]:
        """The history: one message per projecting surface node, in order."""
        return list(self._history)

    async def wait_beyond(self, seq: int) -> None:
        """Wait until the log holds an event with sequence number `seq` (or more)."""
        if len(self.events) > seq:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def wake_waiters(self) -> None:
        """Release every `wait_beyond` waiter (they re-check their condition)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _commit(self, event: ev.SessionEvent) -> None:
        self.events.append(event)
        kind = event.WhichOneof("payload")
        if kind == "turn_start":
            self.max_turn = max(self.max_turn, event.turn_start.turn)
            self.open_turn = event.turn_start.turn
        elif kind == "turn_end":
            self.open_turn = 0
        elif kind == "request_header":
            self.request_header = event.request_header.header
        elif kind in SURFACE_KINDS:
            self._project(event, kind)

    def _project(self, event: ev.SessionEvent, kind: str) -> None:
        message = project(event, kind)
        op = event.surface_op
        if op.kind == ev.SURFACE_OP_KIND_REPLACE:
            self._surface[op.start : op.end + 1] = [message]
            self._history = [m for m in self._surface if m is not None]
            return
        self._surface.append(message)
        if message is not None:
            self._history.append(message)

    def _publish(self, event: ev.SessionEvent) -> None:
        self._publishing = True
        try:
            for observer in self.observers:
                try:
                    observer(event)
                except Exception:
                    self.observer_failures += 1
                    log.warning("session/event observer failed", exc_info=True)
        finally:
            self._publishing = False
        if self._waiters:
            self.wake_waiters()


def _wrap(tag: str, source: c.Source, content: Sequence[c.ContentBlock]) -> list[c.ContentBlock]:
    """Wrap content in `<tag source="kind">` ... `</tag>`.

    The kind comes from the client: it is escaped, so that it can neither close the
    attribute nor the tag (and so forge another provenance).
    """
    kind = html.escape(source.kind or "user", quote=True)
    if all(block.WhichOneof("block") == "text" for block in content):
        inner = "".join(block.text.text for block in content)
        return [
            c.ContentBlock(text=c.TextBlock(text=f'<{tag} source="{kind}">\n{inner}\n</{tag}>'))
        ]
    return [
        c.ContentBlock(text=c.TextBlock(text=f'<{tag} source="{kind}">')),
        *content,
        c.ContentBlock(text=c.TextBlock(text=f"</{tag}>")),
    ]


def project(event: ev.SessionEvent, kind: str) -> c.Message | None:
    """The history message of one surface event; None for an empty assistant message."""
    if kind == "user_message":
        return c.Message(role=c.ROLE_USER, content=event.user_message.content)
    if kind == "assistant_message":
        msg = event.assistant_message
        if not msg.content:
            return None  # a completion anchor: logged, never projected
        return c.Message(role=c.ROLE_ASSISTANT, content=msg.content, provenance=msg.provenance)
    if kind == "tool_result":
        result = event.tool_result
        block = c.ToolResultBlock(
            tool_call_id=result.call_id, content=result.content, is_error=result.is_error
        )
        return c.Message(role=c.ROLE_USER, content=[c.ContentBlock(tool_result=block)])
    if kind == "context_message":
        ctx = event.context_message
        if ctx.envelope == ev.CONTEXT_ENVELOPE_RAW:
            return c.Message(role=c.ROLE_USER, content=ctx.content)
        return c.Message(role=c.ROLE_USER, content=_wrap("context", ctx.source, ctx.content))
    steering = event.steering_message
    return c.Message(role=c.ROLE_USER, content=_wrap("steering", steering.source, steering.content))


def session_message(session: SessionLog) -> session_pb2.Session:
    """The `Session` resource of a session log."""
    return session_pb2.Session(
        session_id=session.session_id,
        agent_id=session.agent_id,
        header=session.header,
        event_count=len(session),
        turn_count=session.max_turn,
    )
