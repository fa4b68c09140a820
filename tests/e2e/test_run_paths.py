"""The ways a newcomer starts things: `make run` on another port with a config file that
names no agents (the demo agent answers), and `pip install .` from a checkout (the SDK
comes from clients/python)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.e2e.test_packaging import importable, run, venv
from tests.processes import REPO, SERVER_LISTENING, free_port, read_line, token_free_env


async def test_make_run_takes_listen_and_a_config_without_agents_keeps_the_demo(
    tmp_path: Path,
) -> None:
    config = tmp_path / "only-store.yaml"
    config.write_text("store: memory\n")
    address = f"127.0.0.1:{free_port()}"
    # `-o`: the venv counts as made (a test does not reinstall it).
    process = await asyncio.create_subprocess_exec(
        "make", "-s", "--no-print-directory", "-o", ".venv/.installed", "run",
        f"LISTEN={address}", f"CONFIG={config}",
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env=token_free_env(), start_new_session=True,
    )  # fmt: skip
    try:
        banner = await read_line(process)
        match = SERVER_LISTENING.fullmatch(banner)
        assert match and match.group(1) == address, banner
        sent = await run(
            str(REPO / ".venv" / "bin" / "agentloop"), "--address", address,
            "send", "assistant", "how many words are in this sentence",
        )  # fmt: skip
        assert "7 words" in sent
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        async with asyncio.timeout(10):
            await process.wait()


@pytest.mark.timeout(600)  # the server's dependencies are installed into the venv
async def test_pip_install_of_a_checkout_brings_the_sdk_from_clients_python(
    tmp_path: Path,
) -> None:
    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for name in ("server", "build_support", "clients/python"):
        shutil.copytree(REPO / name, checkout / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, checkout / name)
    python = str((await venv(tmp_path / "venv")) / "python")
    await run(python, "-m", "pip", "install", "--quiet", ".", cwd=checkout)
    probe = importable("server", "agentloop.client", "agentloop.cli")
    assert (await run(python, "-c", probe, cwd=tmp_path)).split() == ["True", "True", "True"]
    shown = await run(python, "-m", "pip", "show", "agentloop-client")
    assert "Name: agentloop-client" in shown
