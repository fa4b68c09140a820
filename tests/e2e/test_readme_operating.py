"""The README's "Operating it" snippets, run as written against a real server process.

Only the addresses change: the server listens on a free port (`--listen`, and
`$AGENTLOOP_ADDRESS` for the CLI) and the metrics port is a free one, so the test does
not collide with a server already running on the defaults. The server's data directory
is a temporary one (the snippets run there, with the repository's `.venv`).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

from tests.processes import REPO, free_port, kill, read_line, token_free_env, wait_exit

T = 60.0
VENV = f"{REPO}/.venv/bin/"


def section(heading: str) -> str:
    """The README's text under `heading`, up to the next heading of any level."""
    readme = (REPO / "README.md").read_text()
    start = readme.index(f"\n{heading}\n") + len(heading) + 2
    end = re.search(r"\n#{2,3} ", readme[start:])
    return readme[start : start + end.start()] if end else readme[start:]


def blocks(text: str, lang: str) -> list[str]:
    """The fenced blocks of `text` in language `lang` ("" for plain fences)."""
    found: list[str] = []
    body: list[str] | None = None
    for line in text.splitlines():
        if body is None and line.startswith("```"):
            body, kind = [], line[3:].strip()
        elif body is not None and line.startswith("```"):
            if kind == lang:
                found.append("\n".join(body) + "\n")
            body = None
        elif body is not None:
            body.append(line)
    return found


def as_here(script: str, listen: str) -> str:
    """The snippet with this test's addresses and the repository's venv."""
    script = script.replace(".venv/bin/", VENV)
    return script.replace("-m server ", f"-m server --listen {listen} ").replace(
        "-m server\n", f"-m server --listen {listen}\n"
    )


async def run_bash(script: str, cwd: Path, listen: str) -> str:
    """Run `script` with bash -e; background jobs are stopped at its end. Its stdout."""
    env = token_free_env(AGENTLOOP_ADDRESS=listen, NO_COLOR="1")
    wrapped = "set -e\ntrap 'kill $(jobs -p) 2> /dev/null || true' EXIT\n" + script
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", wrapped, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(T):
            stdout, stderr = await process.communicate()
    finally:
        await kill(process)
    assert process.returncode == 0, stderr.decode() + stdout.decode()
    return stdout.decode()


async def test_the_metrics_snippet_prints_what_the_readme_shows(tmp_path: Path) -> None:
    text = section("### Metrics")
    script, shown = blocks(text, "sh")[0], blocks(text, "")[0]
    listen, metrics = f"127.0.0.1:{free_port()}", str(free_port())
    assert "9464" in script
    out = await run_bash(as_here(script, listen).replace("9464", metrics), tmp_path, listen)
    scraped = [line for line in out.splitlines() if line.startswith("agentloop_")]
    assert sorted(scraped) == sorted(shown.strip().splitlines())


async def test_the_json_log_lines_carry_the_fields_the_readme_shows(tmp_path: Path) -> None:
    text = section("### Logs")
    command = blocks(text, "sh")[0].strip()
    shown = [json.loads(line) for line in blocks(text, "json")[0].strip().splitlines()]
    listen = f"127.0.0.1:{free_port()}"
    argv = as_here(command + "\n", listen).split()
    server = await asyncio.create_subprocess_exec(
        *argv, cwd=tmp_path, env=token_free_env(), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        banner = json.loads(await read_line(server))  # the listening line: JSON too
        assert banner["listen"] == listen and banner["message"].endswith(listen)
        await run_bash(f'{VENV}agentloop send assistant "hello"\n', tmp_path, listen)
        server.send_signal(signal.SIGTERM)
        assert await wait_exit(server) == 0
    finally:
        await kill(server)
    assert server.stderr is not None
    lines = [json.loads(line) for line in (await server.stderr.read()).decode().splitlines()]
    for example in shown:  # a line like each of the README's, with the same fields
        like = [
            line
            for line in lines
            if line["logger"] == example["logger"]
            and line["message"].split(" ")[:2] == example["message"].split(" ")[:2]
        ]
        assert like, f"no line like {example}"
        assert set(like[0]) == set(example), (like[0], example)
    access = [line for line in lines if line["logger"] == "agentloop.access"]
    assert {"/agentloop.v1.AgentService/SendMessage"} <= {line["method"] for line in access}


async def test_the_cli_reference_snippet_runs(tmp_path: Path) -> None:
    script = blocks(section("### CLI reference"), "sh")[0]
    listen = f"127.0.0.1:{free_port()}"
    serve = f"{VENV}python -m server --listen {listen} > /dev/null &\n"
    ready = f"until {VENV}agentloop agents > /dev/null 2>&1; do sleep 0.2; done\n"
    out = await run_bash(serve + ready + as_here(script, listen), tmp_path, listen)
    lines = out.splitlines()
    assert json.loads(lines[0])["idle"] is True  # `--json wait assistant`
    assert any(line.startswith("agentloop ") for line in lines)  # `--version`
