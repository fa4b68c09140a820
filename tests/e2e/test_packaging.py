"""The two Python distributions as a user installs them, each into an empty venv.

`agentloop-client` (clients/python): the generated contract, `agentloop.Client` and the
`agentloop` CLI, not the server; a short program streams a turn from a real server
with it and decodes the details of its refusals. `agentloop-server` (the root): the
server only, which brings the SDK as a dependency.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import E2E
from tests.processes import REPO

PROGRAM = """
import asyncio, sys
from agentloop import InvalidArgument, NotFound, connect

async def main():
    client = connect(sys.argv[1])
    await client.create("wheel")
    kinds = [e.WhichOneof("payload") async for e in await client.send("wheel", "hi")]
    print(kinds[0], kinds[-1])
    try:
        await client.create("bad", max_parallel_tool_calls=0)
    except InvalidArgument as error:  # the details decoded with the SDK's own dependencies
        print(error.reason, error.field)
    try:
        await client.get_agent("nobody")
    except NotFound as error:
        print(error.reason, error.domain)
    await client.close()

asyncio.run(main())
"""


def importable(*modules: str) -> str:
    """A program printing, for each module, whether it can be imported (True/False)."""
    return f"import importlib.util as u; print(*(u.find_spec(m) is not None for m in {modules}))"


async def run(*argv: str, cwd: Path | None = None) -> str:
    """Run a process to its end (in `cwd`, away from the repository's `server/`)."""
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    async with asyncio.timeout(300):
        out, _ = await process.communicate()
    assert process.returncode == 0, f"{' '.join(argv)}: {out.decode()}"
    return out.decode()


async def build(source: Path, wheels: Path, name: str) -> Path:
    """The wheel `NAME-*.whl` of the project at `source` (a copy: a build writes beside
    its sources)."""
    await run(
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "-w", str(wheels), str(source),
    )  # fmt: skip
    return the_wheel(wheels, name)


def the_wheel(wheels: Path, name: str) -> Path:
    (wheel,) = wheels.glob(f"{name}-*.whl")
    return wheel


async def sdk_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "client-source"
    shutil.copytree(
        REPO / "clients" / "python",
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    return await build(source, tmp_path / "wheels", "agentloop_client")


async def server_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "server-source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "server", source / "server", ignore=ignore)
    shutil.copytree(REPO / "build_support", source / "build_support", ignore=ignore)
    return await build(source, tmp_path / "wheels", "agentloop_server")


async def venv(path: Path) -> Path:
    """An empty venv; its bin directory."""
    await run(sys.executable, "-m", "venv", str(path))
    return path / "bin"


@pytest.mark.timeout(300)  # its dependencies (grpcio, protobuf, the ACP SDK) are installed
async def test_the_sdk_wheel_installs_alone_and_streams_a_turn(e2e: E2E, tmp_path: Path) -> None:
    wheel = await sdk_wheel(tmp_path)
    bin_dir = await venv(tmp_path / "venv")
    python = str(bin_dir / "python")
    await run(python, "-m", "pip", "install", "--quiet", str(wheel))
    # The SDK alone: no server inside, and nothing of the server's dependencies.
    probe = importable("server", "agentloop.cli", "yaml", "asyncpg")
    assert (await run(python, "-c", probe, cwd=tmp_path)).split() == [
        "False",
        "True",
        "False",
        "False",
    ]
    program = tmp_path / "main.py"
    program.write_text(PROGRAM)
    out = await run(python, str(program), e2e.target, cwd=tmp_path)
    assert out.split() == [
        "turn_start", "turn_end",
        "INVALID_FIELD", "options.max_parallel_tool_calls",
        "AGENT_NOT_FOUND", "agentloop.v1",
    ]  # fmt: skip
    # The CLI ships with the SDK, as the `agentloop` console script.
    assert (await run(str(bin_dir / "agentloop"), "--version", cwd=tmp_path)).split() == [
        "agentloop",
        "0.1.0",
    ]
    listed = await run(str(bin_dir / "agentloop"), "--address", e2e.target, "agents")
    assert listed.split()[3:5] == ["wheel", "idle"]


@pytest.mark.timeout(600)  # the server's dependencies are installed into the venv too
async def test_the_server_wheel_brings_the_sdk(tmp_path: Path) -> None:
    await sdk_wheel(tmp_path)
    wheel = await server_wheel(tmp_path)
    bin_dir = await venv(tmp_path / "venv")
    python = str(bin_dir / "python")
    # The SDK comes from the wheel built beside it (it is not on any index).
    await run(
        python, "-m", "pip", "install", "--quiet", "--find-links", str(tmp_path / "wheels"),
        str(wheel),
    )  # fmt: skip
    probe = importable("server", "agentloop.client", "agentloop.cli")
    assert (await run(python, "-c", probe, cwd=tmp_path)).split() == ["True", "True", "True"]
    assert "Name: agentloop-client" in await run(python, "-m", "pip", "show", "agentloop-client")
    version = await run(str(bin_dir / "agentloop-server"), "--version", cwd=tmp_path)
    assert version.split() == ["agentloop", "0.1.0"]
    cli_version = await run(str(bin_dir / "agentloop"), "--version", cwd=tmp_path)
    assert cli_version == version
