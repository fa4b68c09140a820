"""The history projection of a session log, and the folds the loop reads off it.

History is a projection of the surface events, kept incrementally in a list that only
grows (a replacement builds a new one), so that a step's snapshot of it is a view that
costs nothing, not a copy or a pass over the whole log. Beside it, the folds: turn
numbering (the highest turn, the open one) and the latest logged request header.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence

from agentloop.v1 import content_pb2 as c
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.history import MessageView

_ATTRIBUTE_ESCAPES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"}
)
"""`html.escape(..., quote=True)`'s table: importing `html` loads its 2,231 named
entities (0.4 MB of the server's resident memory at start) for these five."""

SURFACE_KINDS = frozenset(
    {"user_message", "assistant_message", "tool_result", "context_message", "steering_message"}
)
"""The payload kinds that produce history."""

FOLDED_KINDS = SURFACE_KINDS | {"turn_start", "turn_end", "request_header"}
"""The payload kinds a projection reads; it passes over the others."""


class Projection:
    """What a session's events project: the model's history, turn numbering, the header.

    A projection may start mid-log (`partial`), at a replay point (`replay.py`): the
    events from there on hold a compaction, whose summary stands for every node before
    its kept part and whose `header` is the one in force. Until that compaction is
    applied, the nodes it replaces that precede the replay point are unknown; it
    counts them and puts placeholders there, so its REPLACE lands as in a whole replay.
    """

    def __init__(self, *, partial: bool = False) -> None:
        self.partial = partial
        """Started after the log's first event, and no compaction applied yet."""
        self.max_turn = 0
        self.open_turn = 0
        """The turn whose `turn/start` is the last boundary; 0 when none is open."""
        self.request_header: c.RequestHeader | None = None
        """The latest logged request header (the fold: the latest snapshot wins)."""
        self.usage_tokens = 0
        """The context the last reported usage accounts for (input + output); 0: none
        since the last replacement."""
        self.usage_seq = 0
        """The seq of the step that reported it: what the history gained since is estimated."""
        self._history: list[c.Message] = []
        self._surface: list[c.Message | None] = []
        self._seqs = array("Q")
        """The seq of each surface node's event (8 bytes a node, not an int object)."""

    def apply(self, event: ev.SessionEvent, kind: str = "") -> None:
        """Fold one event in, after those applied so far (`kind`: its payload's, if known)."""
        kind = kind or event.WhichOneof("payload") or ""
        if kind not in FOLDED_KINDS:  # most events (chunks, steps, tools) fold nothing
            return
        match kind:
            case "turn_start":
                self.max_turn = max(self.max_turn, event.turn_start.turn)
                self.open_turn = event.turn_start.turn
            case "turn_end":
                self.open_turn = 0
                # A replay from a point inside a log may not hold this turn's start.
                self.max_turn = max(self.max_turn, event.turn_end.turn)
            case "request_header":
                self.request_header = event.request_header.header
            case str(kind) if kind in SURFACE_KINDS:
                self._project(event, kind)

    def messages(self) -> list[c.Message]:
        """The history: one message per projecting surface node, in order (a new list)."""
        return list(self._history)

    def view(self) -> MessageView:
        """The history as it is now, without a copy: later appends do not show in it.

        Appends extend the list in place and a replacement builds a new one, so the
        view's messages stay those of this moment.
        """
        return MessageView(self._history, len(self._history))

    def surface(self) -> list[tuple[c.Message | None, int]]:
        """The surface nodes, as a REPLACE op's `start` and `end` count them (a new list).

        Each node is its message (None for a completion anchor) and its event's seq.
        """
        return list(zip(self._surface, self._seqs, strict=True))

    def messages_after(self, seq: int) -> list[c.Message]:
        """The history messages of the surface events after `seq`."""
        start = bisect.bisect_right(self._seqs, seq)
        return [m for m in self._surface[start:] if m is not None]

    def _project(self, event: ev.SessionEvent, kind: str) -> None:
        message = project(event, kind)
        op = event.surface_op
        if op.kind == ev.SURFACE_OP_KIND_REPLACE:
            if self.partial:
                self._anchor(event, op.end)
            if kind == "context_message" and event.context_message.compaction.HasField("header"):
                self.request_header = event.context_message.compaction.header
            self._surface[op.start : op.end + 1] = [message]
            self._seqs[op.start : op.end + 1] = array("Q", [event.seq])
            # A new list: the views taken of the old one keep their messages.
            self._history = [m for m in self._surface if m is not None]
            self.usage_tokens = 0  # the reported size was of the history replaced
            return
        self._surface.append(message)
        self._seqs.append(event.seq)
        if message is not None:
            # In place, as `append` would, but no call: the seq kept above costs one.
            self._history += (message,)
        if kind == "assistant_message":
            usage = event.assistant_message.usage
            self.usage_tokens = usage.input_tokens + usage.output_tokens
            self.usage_seq = event.seq

    def _anchor(self, event: ev.SessionEvent, end: int) -> None:
        """Put placeholders for the replaced nodes older than the replay's first event."""
        last_seq = event.context_message.compaction.last_seq
        missing = end + 1 - bisect.bisect_right(self._seqs, last_seq)
        if missing < 0:
            raise ValueError(f"event {event.seq} replaces fewer nodes than the replay holds")
        self._surface[0:0] = [None] * missing
        self._seqs[0:0] = array("Q", bytes(8 * missing))
        self.partial = False


def _wrap(tag: str, source: c.Source, content: Sequence[c.ContentBlock]) -> list[c.ContentBlock]:
    """Wrap content in `<tag source="kind">` ... `</tag>`.

    The kind comes from the client: it is escaped, so that it can neither close the
    attribute nor the tag (and so forge another provenance).
    """
    kind = (source.kind or "user").translate(_ATTRIBUTE_ESCAPES)
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
    """The history message of one surface event; None for an empty assistant message.

    Parts of the event are copied in with `extend` and `CopyFrom`: handed to a
    constructor, another message's fields cost about twice as much.
    """
    message = c.Message(role=c.ROLE_USER)
    if kind == "user_message":
        message.content.extend(event.user_message.content)
    elif kind == "assistant_message":
        msg = event.assistant_message
        if not msg.content:
            return None  # a completion anchor: logged, never projected
        message.role = c.ROLE_ASSISTANT
        message.content.extend(msg.content)
        message.provenance.CopyFrom(msg.provenance)
    elif kind == "tool_result":
        result = event.tool_result
        block = message.content.add().tool_result
        block.tool_call_id = result.call_id
        block.content.extend(result.content)
        block.is_error = result.is_error
    elif kind == "context_message":
        ctx = event.context_message
        if ctx.envelope == ev.CONTEXT_ENVELOPE_RAW:
            message.content.extend(ctx.content)
        else:
            message.content.extend(_wrap("context", ctx.source, ctx.content))
    else:
        steering = event.steering_message
        message.content.extend(_wrap("steering", steering.source, steering.content))
    return message
