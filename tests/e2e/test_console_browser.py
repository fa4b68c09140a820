"""The web console in a real browser: headless Chromium (Debian's package) driven by
playwright-core (tests/console/browser.mjs) against a real server with `httpListen` on.

The script creates agents from the page, sends a message and sees the tool call, the
streamed answer and the `completed` turn end; reads each agent's context gauge;
cancels a slow turn and sees `aborted`; approves a pending tool call from the keyboard
and rejects another with a reason; shows a clear message for a wrong token; opens a
link to a seq; shows the MCP servers; shows a lead's sub-agents under it and follows a
`delegate` call to the child's session; deletes a stored session and a live agent's
(refused, then with the agent disposed first), each after a confirmation; switches to
dark mode; prices a session from the sessions list; says "server default" for an
agent that names no provider; and saves a screenshot of the session view. The
server's own log is then read over gRPC to confirm each act.
Set AGENTLOOP_ARTIFACTS to a directory to keep the screenshot (`console.png`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import grpc
import pytest

from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import approval_pb2
from server.settings.config import Config
from server.settings.prices import PriceConfig
from tests.e2e.conftest import E2E, of_kind, running_app
from tests.e2e.test_mcp_tools import stdio_box
from tests.processes import PluginLauncher, guard_example

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "console" / "browser.mjs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TOKEN = "console-token-1"
BROWSER_TIMEOUT = 180.0
"""A bound on the whole browser run (each wait inside it is bounded at 15 s)."""

pytestmark = [pytest.mark.usefixtures("without_tokens"), pytest.mark.timeout(240)]


def _runnable() -> str:
    """Why the browser test cannot run here ("" when it can)."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (apt-get install chromium; .ci/run installs it)"
    if shutil.which("node") is None:
        return "node is missing"
    if not (ROOT / "node_modules" / "playwright-core").exists():
        return "node_modules/playwright-core is missing (make setup)"
    return ""


async def test_the_console_in_a_browser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: PluginLauncher
) -> None:
    why = _runnable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)  # CI installs all of it: a missing piece is a failure there
        pytest.skip(why)
    monkeypatch.setenv("AGENTLOOP_TOKEN", TOKEN)
    (tmp_path / "marks").mkdir()
    config = Config(
        listen="127.0.0.1:0",
        http_listen="127.0.0.1:0",
        data_dir=str(tmp_path / "data"),  # a real SQLite file: deletes, forks, resumes
        agents=(),
        mcp_servers=(stdio_box(tmp_path / "marks"),),  # for the MCP servers view
        prices=(PriceConfig("scripted", "echo", 2.5, 10.0, "USD"),),  # the cost figures
    )
    screenshot = tmp_path / "console.png"
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    async with running_app(config) as e2e:
        assert e2e.app.http is not None
        # A plugin in another process, for the plugins view (and a context on each prompt).
        plugin = await launcher.start(guard_example("python"))
        await e2e.registry.RegisterPlugin(
            reg.RegisterPluginRequest(address=plugin.address), metadata=metadata, timeout=10
        )
        await wait_ready(e2e, plugin.name, metadata)
        env = {
            **os.environ,
            "CONSOLE_URL": f"http://127.0.0.1:{e2e.app.http.port}/",
            "CONSOLE_TOKEN": TOKEN,
            "SCREENSHOT": str(screenshot),
            "PROFILE_DIR": str(tmp_path / "profile"),
            "CHROMIUM": CHROMIUM,
            "CONSOLE_PLUGIN": plugin.name,
        }
        process = await asyncio.create_subprocess_exec(
            "node",
            str(SCRIPT),
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), BROWSER_TIMEOUT)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        text = output.decode(errors="replace")
        print(text)  # the steps and their times, shown with -s or on failure
        assert process.returncode == 0, text
        results = json.loads(text.split("RESULTS ", 1)[1].splitlines()[0])

        # What the page showed is what the server recorded.
        demo = await e2e.agents.ListSessionEvents(
            api.ListSessionEventsRequest(agent_id="browser-demo", page_size=1000),
            metadata=metadata,
        )
        got = await e2e.agents.GetSession(
            api.GetSessionRequest(agent_id="browser-demo"), metadata=metadata, timeout=10
        )
        demo_session = got.session.session_id
        assert [(p.provider, p.model, p.currency) for p in got.prices] == [
            ("scripted", "echo", "USD")
        ]
        ends = of_kind(demo.events, "turn_end")
        assert [end.turn_end.reason.WhichOneof("kind") for end in ends] == ["completed"]
        calls = of_kind(demo.events, "tool_call")
        assert [call.tool_call.name for call in calls] == ["word_count"]
        # The figures the page drew are the server's: the turn's and session's tokens.
        usage = [m.assistant_message.usage for m in of_kind(demo.events, "assistant_message")]
        spent = sum(u.input_tokens for u in usage), sum(u.output_tokens for u in usage)
        tokens = f"{spent[0]} in, {spent[1]} out"
        cost = f"cost {(spent[0] * 2.5 + spent[1] * 10) / 1e6:.6f} USD"
        assert results["turnFigures"].endswith(f"{tokens} tokens · {cost}")
        assert results["sessionTokens"] == f"Tokens: {tokens} in 1 ended turns · {cost}"
        assert f"cost {results['listedCost']}" == cost  # the sessions list's cost column
        answer = "".join(
            b.text.text
            for m in of_kind(demo.events, "assistant_message")
            for b in m.assistant_message.content
            if b.WhichOneof("block") == "text"
        )
        assert answer.strip() == results["answer"].strip()
        # Each parallel call's own duration, as the page drew it, is the one stored.
        parallel = await e2e.agents.ListSessionEvents(
            api.ListSessionEventsRequest(agent_id="browser-parallel", page_size=1000),
            metadata=metadata,
        )
        ran = [
            (r.end_time.ToMilliseconds() - r.start_time.ToMilliseconds()) / 1000
            for r in (e.tool_result for e in of_kind(parallel.events, "tool_result"))
        ]
        assert len(ran) == 4 and ran[0] >= 4.0 and ran[1] >= 1.0  # the naps: 4 s, then 1 s
        for shown, seconds in zip(results["parallelTimings"], ran, strict=True):
            assert shown.startswith(f"ran {seconds:.3f} s from +"), (shown, seconds)
        slow = await e2e.agents.ListSessionEvents(
            api.ListSessionEventsRequest(agent_id="browser-slow", page_size=1000),
            metadata=metadata,
        )
        (end,) = of_kind(slow.events, "turn_end")
        assert end.turn_end.reason.aborted.reason == "cancelled from the console"
        assert results["partial"] >= 3  # the answer was streaming when it was cancelled
        # The approvals answered from the page: both by `api:console`, in the log.
        asked = await e2e.agents.ListSessionEvents(
            api.ListSessionEventsRequest(agent_id="browser-approval", page_size=1000),
            metadata=metadata,
        )
        resolved = [e.approval_resolved for e in of_kind(asked.events, "approval_resolved")]
        assert [(r.outcome, r.resolved_by, r.reason) for r in resolved] == [
            (approval_pb2.APPROVAL_OUTCOME_ALLOWED_ONCE, "api:console", ""),
            (approval_pb2.APPROVAL_OUTCOME_REJECTED, "api:console", "not this one"),
        ]
        (end,) = of_kind(asked.events, "turn_end")
        assert end.turn_end.reason.WhichOneof("kind") == "completed"
        assert "4 words" in results["approvedResult"]
        assert 'the user rejected tool "word_count": not this one' in results["rejectedResult"]
        assert "Answering the approval failed: FAILED_PRECONDITION" in results["staleRefusal"]
        # The fork the page made, resumed and driven one turn on, then disposed.
        fork = await e2e.agents.GetSession(
            api.GetSessionRequest(session_id="browser-demo-fork"), metadata=metadata, timeout=10
        )
        assert fork.session.header.parent_session_id == demo_session
        assert (fork.session.turn_count, fork.session.agent_id) == (2, "")
        # The manual compaction the page asked for: recorded with its instructions, or
        # refused with the server's reason (too little history to compact).
        events = await e2e.agents.ListSessionEvents(
            api.ListSessionEventsRequest(session_id="browser-demo-fork", page_size=1000),
            metadata=metadata,
            timeout=10,
        )
        compactions = [
            e.context_message.compaction
            for e in events.events
            if e.WhichOneof("payload") == "context_message"
            and e.context_message.HasField("compaction")
        ]
        if results["compact"].startswith("Compacted"):
            assert [c.instructions for c in compactions] == ["focus on the word counts"]
        else:
            assert results["compact"].startswith("Not compacted: ") and not compactions
        # The deletes the page confirmed: both sessions gone, the lead and its child too.
        for deleted in (results["childSession"], results["leadSession"]):
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await e2e.agents.GetSession(
                    api.GetSessionRequest(session_id=deleted), metadata=metadata, timeout=10
                )
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert "SESSION_IN_USE" in results["refusedDelete"]
        live = await e2e.factory.ListAgents(fac.ListAgentsRequest(), metadata=metadata, timeout=10)
        assert not [a.agent_id for a in live.agents if a.agent_id.startswith("browser-lead")]
        assert "/ 8k tokens" in results["gauge"]
        # The sessions page listed what the server lists.
        listed = await e2e.agents.ListSessions(
            api.ListSessionsRequest(page_size=1000), metadata=metadata, timeout=10
        )
        later = "browser-elsewhere-session-"  # made after the sessions page was read
        ids = [s.session_id for s in listed.sessions if not s.session_id.startswith(later)]
        assert results["allSessions"] == ids
    assert "wrong token" in results["wrongToken"]
    keep_artifact(screenshot)


async def wait_ready(e2e: E2E, name: str, metadata: tuple[tuple[str, str], ...]) -> None:
    """Wait (at most 10 s) until ListPlugins shows the plugin READY."""
    for _ in range(500):
        listed = await e2e.registry.ListPlugins(
            reg.ListPluginsRequest(), metadata=metadata, timeout=10
        )
        if any(p.name == name and p.state == reg.PLUGIN_STATE_READY for p in listed.plugins):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"plugin {name} did not become READY")


def keep_artifact(screenshot: Path) -> None:
    """Check the screenshots and copy them to $AGENTLOOP_ARTIFACTS, when set."""
    tree = screenshot.with_name("console-tree.png")  # the tree of work, for the README
    for shot in (screenshot, tree):
        assert shot.stat().st_size > 10_000
    artifacts = os.environ.get("AGENTLOOP_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(artifacts) / "console.png")
        shutil.copy(tree, Path(artifacts) / "console-tree.png")
