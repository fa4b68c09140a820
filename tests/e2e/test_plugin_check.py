"""The conformance checker (`python -m agentloop.plugin.check`) against real plugin processes."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tests.e2e.test_plugin_conditions import conditioned
from tests.processes import REPO, PluginLauncher, configurable, guard_example, rogue

CHECK_TIMEOUT = 60.0
"""How long one checker run may take (a hanging plugin costs it one deadline)."""


async def run_check(address: str, *flags: str) -> tuple[int, str]:
    """Run the checker on `address`; its exit code and output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentloop.plugin.check", address, *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(CHECK_TIMEOUT):
        output, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, output.decode()


@pytest.mark.parametrize("lang", ["python", "node"])
async def test_the_example_plugins_conform(launcher: PluginLauncher, lang: str) -> None:
    plugin = await launcher.start(guard_example(lang))

    code, output = await run_check(plugin.address)

    assert code == 0, output
    assert "PASS describe" in output and "PASS prompt_submit" in output
    # The helpers take batches when offered: the same call again, in a CallBatch.
    assert "PASS call_batch: prompt_submit" in output
    assert "PASS a cancel and a missed deadline, then a call: it is answered" in output
    assert output.strip().endswith("the plugin conforms")


async def test_the_model_example_conforms(launcher: PluginLauncher) -> None:
    plugin = await launcher.start(
        [sys.executable, str(REPO / "clients/python/examples/model_plugin.py")]
    )

    code, output = await run_check(plugin.address)

    assert code == 0, output
    assert "PASS model plugin-echo" in output
    assert "PASS call_batch: model plugin-echo" in output
    assert "PASS a cancel and a missed deadline, then a call: it is answered" in output


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (
            configurable("python", "--name", "wrong-kind", "--malformed"),
            "FAIL prompt_submit: answered tool_pre_execute to a prompt_submit call",
        ),
        (
            configurable("node", "--name", "mute", "--hang", "--timeout", "0.5"),
            "FAIL prompt_submit: no answer within its deadline (0.5 s)",
        ),
        (
            rogue("--name", "newer", "--unknown-kind"),
            "FAIL prompt_submit: the result holds fields the protocol does not define",
        ),
        (rogue("--name", "chatty", "--extras"), "FAIL call ids: answered more than once"),
        (rogue("--name", "garbler", "--garbage", "9"), "does not decode as a HandleResponse"),
        (
            rogue("--name", "batch-dropper", "--drop-batches"),
            "FAIL call_batch: prompt_submit: no answer within its deadline",
        ),
        (rogue("--name", "strays", "--extras"), "FAIL call ids: answers for calls never sent"),
        (
            rogue("--name", "answers-notices", "--observe-only", "--answer-notifications"),
            "FAIL prompt_submit: a notification was answered",
        ),
        (
            rogue("--name", "fragile", "--die-after-cancel"),
            "FAIL a cancel and a missed deadline, then a call: it is answered:",
        ),
        (rogue("--bad-name"), "FAIL describe: name 'bad name!'"),
        (rogue("--silent-error"), "FAIL prompt_submit: an error outcome without a message"),
        (
            rogue("--chunk-answer"),
            "FAIL prompt_submit: a model chunk answered a call that is not model_stream",
        ),
    ],
    ids=[
        "wrong-kind",
        "hang",
        "unknown-kind",
        "duplicates",
        "garbage",
        "drops-batches",
        "strays",
        "answers-notifications",
        "dies-after-cancel",
        "bad-name",
        "silent-error",
        "chunk-answer",
    ],  # fmt: skip
)
async def test_a_broken_plugin_fails_with_reasons(
    launcher: PluginLauncher, argv: list[str], reason: str
) -> None:
    plugin = await launcher.start(argv)

    code, output = await run_check(plugin.address)

    assert code == 1, output
    assert reason in output, output
    assert "check(s) failed" in output


@pytest.mark.parametrize(
    "flags",
    [("--strict-steps",), ("--observe-only",)],
    ids=["step-numbers", "observe-only"],
)
async def test_a_plugin_that_holds_the_checker_to_the_spec_conforms(
    launcher: PluginLauncher, flags: tuple[str, ...]
) -> None:
    """A plugin that refuses a prompt-submit call outside step 0 (the spec's number), and
    one whose observe-only subscription gets notifications it leaves unanswered."""
    plugin = await launcher.start(rogue("--name", "strict", *flags))

    code, output = await run_check(plugin.address)

    assert code == 0, output
    if "--observe-only" in flags:
        assert "PASS prompt_submit: no answer, as a notification wants" in output
    else:
        assert "PASS prompt_submit" in output


@pytest.mark.parametrize("lang", ["python", "node"])
async def test_a_plugin_with_conditions_conforms(launcher: PluginLauncher, lang: str) -> None:
    plugin = await launcher.start(conditioned(lang, "--name", f"conditioned-{lang}"))

    code, output = await run_check(plugin.address)

    assert code == 0, output
    # Its samples were made to match its conditions, and a call outside them was
    # answered "continue unchanged" by the helper, without running the handler.
    assert "PASS prompt_submit" in output and "PASS tool_pre_execute" in output
    assert 'PASS conditions: prompt_submit: a call outside them is answered "continue' in output
    assert "PASS conditions: tool_pre_execute" in output


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (
            ("--ignore-conditions",),
            "FAIL conditions: prompt_submit: answered prompt_submit to a call its conditions"
            " exclude",
        ),
        (
            ("--bad", "regex"),
            "FAIL describe: subscriptions[0] (SEAM_PROMPT_SUBMIT): conditions.prompt_regex: not"
            " a valid regular expression",
        ),
    ],
    ids=["decides-outside-its-conditions", "bad-regex"],
)
async def test_conditions_a_plugin_breaks_are_reported(
    launcher: PluginLauncher, flags: tuple[str, ...], reason: str
) -> None:
    plugin = await launcher.start(conditioned("python", "--name", "loose", *flags))

    code, output = await run_check(plugin.address)

    assert code == 1, output
    assert reason in output, output


async def test_an_unreachable_address_is_exit_code_2() -> None:
    code, output = await run_check("127.0.0.1:1", "--timeout", "1")
    assert code == 2, output
    assert output.startswith("FAIL Describe failed: UNAVAILABLE")
