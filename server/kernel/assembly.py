"""Folding a model stream into the assistant message it describes, chunk by chunk.

The assembler checks the stream's protocol as it goes: a block opens once, deltas and
ends name an open block, and nothing follows the finish. A violation is a
`CodedError` with code `MODEL_PROTOCOL`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentloop.v1 import content_pb2, stream_pb2
from server.kernel.errors import CodedError

MODEL_PROTOCOL = "MODEL_PROTOCOL"
"""The error code of a malformed model stream."""


@dataclass
class _Block:
    kind: stream_pb2.BlockKind.ValueType
    tool_call_id: str
    tool_name: str
    parts: list[str] = field(default_factory=list)
    ended: bool = False


class MessageAssembler:
    """Accumulates the chunks of one model stream into content, usage and finish."""

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self._usage: content_pb2.Usage | None = None
        self._finish: stream_pb2.Finish | None = None
        self.output_bytes = 0
        """The UTF-8 bytes of the deltas so far: the message's size, as a limit bounds it."""

    def add(self, chunk: stream_pb2.StreamChunk) -> None:
        """Fold one chunk in.

        Args:
            chunk: The next chunk of the stream.

        Raises:
            CodedError: With code `MODEL_PROTOCOL` when the chunk is empty, comes after
                the finish, reopens a block, or names a block that is not open.
        """
        if self._finish is not None:
            raise CodedError("model stream sent a chunk after its finish", MODEL_PROTOCOL)
        match chunk.WhichOneof("chunk"):
            case "block_start":
                start = chunk.block_start
                if start.index in self._blocks:
                    raise CodedError(f"model stream reopened block {start.index}", MODEL_PROTOCOL)
                if start.kind == stream_pb2.BLOCK_KIND_UNSPECIFIED:
                    raise CodedError(
                        f"model stream opened block {start.index} without a kind", MODEL_PROTOCOL
                    )
                self._blocks[start.index] = _Block(start.kind, start.tool_call_id, start.tool_name)
            case "block_delta":
                delta = chunk.block_delta
                text = delta.text
                self._open_block(delta.index, "delta").parts.append(text)
                self.output_bytes += len(text.encode())
            case "block_end":
                self._open_block(chunk.block_end.index, "end").ended = True
            case "usage":
                # Copies, so that a consumer editing the result cannot alter the logged chunk.
                self._usage = content_pb2.Usage()
                self._usage.CopyFrom(chunk.usage)
            case "finish":
                self._finish = stream_pb2.Finish()
                self._finish.CopyFrom(chunk.finish)
            case _:
                raise CodedError("model stream sent an empty chunk", MODEL_PROTOCOL)

    @property
    def content(self) -> list[content_pb2.ContentBlock]:
        """The content so far, in block-index order; empty text and reasoning are dropped.

        Blocks that are still open are included with what they have received.
        """
        # Each block is built empty and set in place: nested constructor calls cost
        # about twice as much.
        out: list[content_pb2.ContentBlock] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            text = "".join(block.parts)
            kind = block.kind
            if kind == stream_pb2.BLOCK_KIND_TOOL_CALL:
                made = content_pb2.ContentBlock()
                call = made.tool_call
                call.id, call.name, call.arguments = block.tool_call_id, block.tool_name, text
            elif not text or (
                kind != stream_pb2.BLOCK_KIND_TEXT and kind != stream_pb2.BLOCK_KIND_REASONING
            ):
                continue
            else:
                made = content_pb2.ContentBlock()
                part = made.text if kind == stream_pb2.BLOCK_KIND_TEXT else made.reasoning
                part.text = text
            out.append(made)
        return out

    @property
    def usage(self) -> content_pb2.Usage | None:
        """The latest usage reported, if any."""
        return self._usage

    @property
    def finish(self) -> stream_pb2.Finish | None:
        """The finish, once it arrived."""
        return self._finish

    def _open_block(self, index: int, what: str) -> _Block:
        block = self._blocks.get(index)
        if block is None:
            raise CodedError(
                f"model stream sent a {what} for unknown block {index}", MODEL_PROTOCOL
            )
        if block.ended:
            raise CodedError(f"model stream sent a {what} for ended block {index}", MODEL_PROTOCOL)
        return block
