"""The CLI's newer verbs and `--json`, as real subprocesses against a real server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from server.edge.app import App
from server.settings.config import AgentConfig, Config
from tests.processes import configurable, plugin_launcher
from tests.test_cli import ROOT, Result, run_cli, server

__all__ = ["server"]  # the fixture, used by name


def lines(result: Result) -> list[Any]:
    assert result.code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def one(result: Result) -> Any:
    [only] = lines(result)
    return only


@pytest.fixture
async def durable(tmp_path: Path) -> AsyncIterator[str]:
    """A server on a SQLite store in `tmp_path` (resume needs one), with `assistant`."""
    assistant = AgentConfig(id="assistant", tools=("word_count",))
    config = Config(listen="127.0.0.1:0", data_dir=str(tmp_path), agents=(assistant,))
    app = App(config)
    port = await app.start()
    yield f"127.0.0.1:{port}"
    await app.stop(grace=0)


async def test_json_send_sessions_fork_resume_inject_steer_wait(durable: str) -> None:
    server = durable
    events = lines(await run_cli(server, "--json", "send", "assistant", "count these words"))
    assert events[-1]["turn_end"]["reason"] == {"completed": {}}
    assert any("tool_call" in e for e in events)

    sessions = one(await run_cli(server, "--json", "sessions"))["sessions"]
    [stored] = [s for s in sessions if s["session_id"].startswith("assistant-session-")]

    forked = one(
        await run_cli(server, "--json", "fork", stored["session_id"], "--new-session-id", "copy")
    )
    assert forked["session_id"] == "copy"
    end_seq = int(events[-1]["seq"])
    early = one(await run_cli(server, "--json", "fork", stored["session_id"], "--at", str(end_seq)))
    assert early["session_id"] != "copy" and int(early["event_count"]) == end_seq  # seqs 1..n

    resumed = one(
        await run_cli(server, "--json", "resume", "helper", "copy", "--tool", "word_count")
    )
    assert (resumed["agent_id"], resumed["session_id"]) == ("helper", "copy")

    injected = one(await run_cli(server, "--json", "inject", "helper", "remember the milk"))
    assert int(injected["next_seq"]) > 0
    steered = one(await run_cli(server, "--json", "steer", "helper", "count two words"))
    assert steered["steering"] is False  # idle: queued as a new message
    waited = one(await run_cli(server, "--json", "wait", "helper", "--for", "20"))
    assert waited["idle"] is True

    tail = lines(await run_cli(server, "--json", "tail", "helper", "--no-follow"))
    contexts = [e for e in tail if "context_message" in e]
    assert contexts and "remember the milk" in json.dumps(contexts[0])
    assert tail[-1]["turn_end"]["reason"] == {"completed": {}}

    assert await run_cli(server, "wait", "helper") == Result(0, "idle\n", "")


async def test_json_of_the_older_verbs(server: str) -> None:
    created = one(await run_cli(server, "--json", "create", "j1", "--tool", "echo"))
    assert created["agent_id"] == "j1" and created["status"] == "AGENT_STATUS_IDLE"
    agents = one(await run_cli(server, "--json", "agents"))["agents"]
    assert [a["agent_id"] for a in agents] == ["assistant", "j1"]
    cancelled = one(await run_cli(server, "--json", "cancel", "j1"))
    assert cancelled["cancelled"] is False
    disposed = one(await run_cli(server, "--json", "dispose", "j1"))
    assert disposed["agent_id"] == "j1"


async def test_plugins_register_list_unregister(server: str, tmp_path: Path) -> None:
    async with plugin_launcher(tmp_path) as launcher:
        plugin = await launcher.start(configurable("python", "--name", "cli-p", "--tag", "X"))
        registered = one(await run_cli(server, "--json", "plugins", "register", plugin.address))
        assert registered["name"] == "cli-p"
        listed = one(await run_cli(server, "--json", "plugins"))["plugins"]
        assert [p["name"] for p in listed] == ["cli-p"]
        table = await run_cli(server, "plugins", "list")
        assert table.stdout.splitlines()[1].split()[:2] == ["cli-p", "ready"], table
        assert one(await run_cli(server, "--json", "plugins", "unregister", "cli-p")) == {}
        assert one(await run_cli(server, "--json", "plugins"))["plugins"] == []


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[str]:
    token = tmp_path / "token"
    token.write_text("s3cret-token-value\n")
    app = App(Config(listen="127.0.0.1:0", store="memory", agents=(), token_file=str(token)))
    port = await app.start()
    yield f"127.0.0.1:{port}"
    await app.stop(grace=0)


async def test_token_option(guarded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTLOOP_TOKEN", raising=False)
    refused = await run_cli(guarded, "agents")
    assert refused.code == 2 and "UNAUTHENTICATED" in refused.stderr
    allowed = await run_cli(guarded, "--token", "s3cret-token-value", "--json", "agents")
    assert one(allowed) == {"agents": []}
    monkeypatch.setenv("AGENTLOOP_TOKEN", "s3cret-token-value")
    assert one(await run_cli(guarded, "--json", "agents")) == {"agents": []}


async def test_version_and_completion() -> None:
    def run(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, check=True
        )
        return done.stdout

    cli, server_version = await asyncio.gather(
        asyncio.to_thread(run, "-m", "agentloop.cli", "--version"),
        asyncio.to_thread(run, "-m", "server", "--version"),
    )
    assert cli.startswith("agentloop ") and cli == server_version
    script = await asyncio.to_thread(run, "-m", "agentloop.cli", "completion", "bash")
    probe = (
        f"{script}\nCOMP_WORDS=(agentloop --address x:1 plugins --o); COMP_CWORD=4; "
        '_agentloop; echo "${COMPREPLY[@]}"'
    )
    completed = await asyncio.to_thread(
        subprocess.run, ["bash", "-c", probe], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "--order"
