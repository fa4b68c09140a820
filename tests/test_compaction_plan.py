"""The cut a compaction makes, the summariser's transcript, and the overflow answers."""

from __future__ import annotations

from pathlib import Path

from agentloop.v1 import agent_pb2
from agentloop.v1 import content_pb2 as c
from server.kernel.tokens import known_window
from server.lifecycle.runtime import build_runtime
from server.loop.compaction import Plan, plan, summary_prompt, transcript
from server.loop.context import policy_of
from server.models.openai_wire import is_overflow
from server.settings.config import load_config


def user(text: str) -> c.Message:
    return c.Message(role=c.ROLE_USER, content=[c.ContentBlock(text=c.TextBlock(text=text))])


def assistant_call(call_id: str) -> c.Message:
    block = c.ToolCallBlock(id=call_id, name="word_count", arguments='{"text": "a b"}')
    return c.Message(role=c.ROLE_ASSISTANT, content=[c.ContentBlock(tool_call=block)])


def result(call_id: str, text: str) -> c.Message:
    block = c.ToolResultBlock(
        tool_call_id=call_id, content=[c.ContentBlock(text=c.TextBlock(text=text))]
    )
    return c.Message(role=c.ROLE_USER, content=[c.ContentBlock(tool_result=block)])


def nodes(*messages: c.Message | None) -> list[tuple[c.Message | None, int]]:
    return [(message, 10 * (i + 1)) for i, message in enumerate(messages)]


def test_the_kept_part_never_starts_at_a_tool_result() -> None:
    history = nodes(
        user("first " * 50),
        assistant_call("c1"),
        result("c1", "2 words " * 40),  # the walk back stops here by size...
        user("x"),
    )
    found = plan(history, keep_tokens=60)
    assert isinstance(found, Plan)
    # ... and moves one node further back: the call stays with its result.
    assert found.end == 0
    assert (found.first_seq, found.last_seq) == (10, 10)
    assert found.kept[0].content[0].WhichOneof("block") == "tool_call"


def test_keeping_nothing_summarises_everything_and_anchors_count_as_nodes() -> None:
    history = nodes(user("a"), None, user("b"))
    found = plan(history, keep_tokens=0)
    assert isinstance(found, Plan)
    assert (found.end, found.last_seq) == (2, 30)
    assert [m.content[0].text.text for m in found.messages] == ["a", "b"]
    assert found.kept == []


def test_nothing_to_compact_says_why() -> None:
    assert str(plan(nodes(user("a"), user("b")), keep_tokens=10_000)).startswith("nothing older")
    summary = user('<context source="compaction">\nSummary ...\n</context>')
    assert "already one summary" in str(plan(nodes(summary, user("b" * 400)), keep_tokens=50))


def test_the_transcript_cuts_tool_output_and_the_oldest_part() -> None:
    messages = [user("hello"), assistant_call("c1"), result("c1", "y" * 5000)]
    text = transcript(messages, max_chars=100_000)
    assert text.splitlines()[0] == "[user] hello"
    assert '[tool call word_count] {"text": "a b"}' in text
    assert len(text.splitlines()[2]) == len("[tool result] ") + 2000
    short = transcript(messages, max_chars=50)
    assert short.startswith("[the oldest part is omitted]\n") and short.endswith("y" * 30)
    assert summary_prompt("T", "bugs").endswith("</transcript>\nFocus on: bugs")


def test_overflow_answers_by_code_or_by_message() -> None:
    assert is_overflow('{"error": {"code": "context_length_exceeded", "message": "x"}}')
    assert is_overflow(
        '{"error": {"message": "This model\'s maximum context length is 8192 tokens"}}'
    )
    assert not is_overflow('{"error": {"code": "invalid_api_key", "message": "bad key"}}')
    assert not is_overflow("upstream failure")


def test_the_window_comes_from_options_then_config_then_the_model_table(tmp_path: Path) -> None:
    config_file = tmp_path / "agentloop.yaml"
    config_file.write_text(
        "store: memory\nagents: []\noutputReserveTokens: 8000\nkeepRecentTokens: 30000\n"
        "providers:\n"
        "  - {name: local, baseUrl: 'http://127.0.0.1:1/v1', contextWindowTokens: 32768}\n"
        "  - {name: cloud, baseUrl: 'http://127.0.0.1:2/v1'}\n"
    )
    runtime = build_runtime(load_config(config_file))
    local = policy_of(agent_pb2.AgentOptions(), runtime, "local", "llama3.1")
    # The configured window; the keep is at most a quarter of it.
    assert (local.window, local.reserve, local.keep_recent) == (32768, 8000, 8192)
    assert local.compact_at == 32768 - 8000
    cloud = policy_of(agent_pb2.AgentOptions(), runtime, "cloud", "gpt-4o-2024-08-06")
    assert (cloud.window, cloud.keep_recent) == (128_000, 30000)
    unknown = policy_of(agent_pb2.AgentOptions(), runtime, "cloud", "my-finetune")
    assert (unknown.window, unknown.compact_at) == (0, 0)
    own = agent_pb2.AgentOptions(
        context_window_tokens=4096, output_reserve_tokens=100, auto_compact=False
    )
    mine = policy_of(own, runtime, "local", "llama3.1")
    assert (mine.window, mine.reserve, mine.compact_at) == (4096, 100, 0)
    assert known_window("openai/gpt-4.1-mini") == 1_047_576
