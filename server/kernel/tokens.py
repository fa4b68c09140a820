"""Token accounting: the documented estimate, and the context windows of common models.

A provider's reported usage is the truth; when there is none (a provider that reports
nothing, messages appended since the last report, a history just compacted) the size
is estimated as serialized bytes / 4: about four characters per token for English text
and code, and an overestimate for protobuf framing, which errs on the side of
compacting early rather than overflowing.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentloop.v1 import content_pb2 as c

BYTES_PER_TOKEN = 4
"""The estimate's divisor (the same for every provider: none documents a better one
that holds across languages and tokenizers)."""

DEFAULT_OUTPUT_RESERVE = 16_384
"""Tokens kept free for the model's output unless configured (pi's `reserveTokens`)."""

DEFAULT_KEEP_RECENT = 20_000
"""Recent history a compaction keeps verbatim unless configured (pi's `keepRecentTokens`,
Codex's 20,000 tokens of recent user messages)."""

MAX_SHARE = 4
"""Reserve and keep-recent are each at most a quarter of the window: a small window
still leaves room to compact into."""

MODEL_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("deepseek", 128_000),
    ("claude", 200_000),
    ("gemini-1.5", 1_048_576),
    ("gemini-2", 1_048_576),
    ("llama-3", 128_000),
    ("qwen", 131_072),
    ("mistral-large", 128_000),
)
"""Context windows by model-name prefix, first match wins; a model not listed has an
unknown window (0) unless config or the agent's options set one."""


def known_window(model: str) -> int:
    """The window of a common model by its name's prefix; 0 when unknown."""
    name = model.lower().rsplit("/", 1)[-1]  # "openai/gpt-4o" as served by routers
    for prefix, window in MODEL_WINDOWS:
        if name.startswith(prefix):
            return window
    return 0


def estimate_bytes(size: int) -> int:
    """Tokens of `size` serialized bytes (rounded up)."""
    return -(-size // BYTES_PER_TOKEN)


def estimate_messages(messages: Iterable[c.Message]) -> int:
    """Estimated tokens of `messages`."""
    return estimate_bytes(sum(message.ByteSize() for message in messages))


def reported_tokens(usage: c.Usage) -> int:
    """The context a step's reported usage accounts for: its input and its output."""
    return usage.input_tokens + usage.output_tokens
