"""The Python SDK as a user installs it: a wheel of `clients/python` in an empty venv.

It brings the generated contract and `agentloop.Client`, not the server, and a short
program streams a turn from a real server with it.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

from tests.e2e.conftest import E2E
from tests.processes import REPO

PROGRAM = """
import asyncio, sys
from agentloop import connect

async def main():
    client = connect(sys.argv[1])
    await client.create("wheel")
    kinds = [e.WhichOneof("payload") async for e in await client.send("wheel", "hi")]
    print(kinds[0], kinds[-1])
    await client.close()

asyncio.run(main())
"""


async def run(*argv: str, cwd: Path | None = None) -> str:
    """Run a process to its end (in `cwd`, away from the repository's `server/`)."""
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    async with asyncio.timeout(300):
        out, _ = await process.communicate()
    assert process.returncode == 0, f"{' '.join(argv)}: {out.decode()}"
    return out.decode()


async def test_the_sdk_wheel_installs_alone_and_streams_a_turn(e2e: E2E, tmp_path: Path) -> None:
    # Built from a copy: a build writes build/ and *.egg-info beside its sources.
    source = tmp_path / "source"
    shutil.copytree(
        REPO / "clients" / "python",
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    wheels = tmp_path / "wheels"
    await run(
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "-w", str(wheels), str(source),
    )  # fmt: skip
    (wheel,) = wheels.glob("agentloop_client-*.whl")
    venv = tmp_path / "venv"
    await run(sys.executable, "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    await run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel))
    # The SDK alone: no server inside.
    probe = "import importlib.util as u; print(u.find_spec('server') is None)"
    assert (await run(python, "-c", probe, cwd=tmp_path)).strip() == "True"
    program = tmp_path / "main.py"
    program.write_text(PROGRAM)
    out = await run(python, str(program), e2e.target, cwd=tmp_path)
    assert out.split() == ["turn_start", "turn_end"]
