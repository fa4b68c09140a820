"""`agentloop compact` as a real subprocess against a real server."""

from __future__ import annotations

import json

from tests.test_cli import run_cli, server

__all__ = ["server"]  # the fixture, used by name


async def test_compact_summarises_with_instructions_then_has_nothing_left(server: str) -> None:
    for text in ("remember the milk", "and the eggs"):
        sent = await run_cli(server, "send", "assistant", text)
        assert sent.code == 0, sent.stderr
    result = await run_cli(
        server, "--json", "compact", "assistant", "--instructions", "shopping",
        "--keep-recent-tokens", "0",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["compacted"] is True
    assert answer["compaction"]["instructions"] == "shopping"
    assert answer["compaction"]["trigger"] == "COMPACTION_TRIGGER_MANUAL"
    # The history is one summary now: nothing older than the recent part is left.
    again = await run_cli(server, "compact", "assistant", "--keep-recent-tokens", "0")
    assert again.code == 0, again.stderr
    assert again.stdout.startswith("nothing compacted: the history older than")


async def test_compact_reports_a_refusal_naming_the_problem(server: str) -> None:
    result = await run_cli(server, "compact", "nobody")
    assert result.code != 0
    assert "NOT_FOUND" in result.stderr and "nobody" in result.stderr
