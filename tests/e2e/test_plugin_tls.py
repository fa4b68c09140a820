"""A plugin served over TLS: reached as tls://host:port with the configured roots."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentloop.plugin.sdk import Plugin, block_prompt
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import agent_pb2, decision_pb2
from agentloop.v1 import content_pb2 as c
from server.edge.app import App
from server.kernel.errors import FailedPrecondition
from server.plugins.registry import Overrides
from server.settings.config import Config


async def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, made by the openssl binary."""
    key, cert = directory / "plugin.key", directory / "plugin.crt"
    process = await asyncio.create_subprocess_exec(
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()
    return key, cert


def guard() -> Plugin:
    plugin = Plugin("tls-guard")

    @plugin.prompt_submit()
    async def refuse(call: hs.HookCall) -> decision_pb2.PromptDecision:
        return block_prompt("seen over TLS")

    return plugin


async def test_a_tls_plugin_is_used_with_the_configured_roots(tmp_path: Path) -> None:
    key, cert = await make_certificate(tmp_path)
    plugin = guard()
    port = await plugin.serve("127.0.0.1:0", tls_key=str(key), tls_cert=str(cert))
    app = App(Config(listen="127.0.0.1:0", store="memory", plugin_ca_file=str(cert)))
    await app.start()
    try:
        registered = await app.plugins.register(f"tls://127.0.0.1:{port}", Overrides())
        assert registered.name == "tls-guard"
        agent = await app.factory.create("a", agent_pb2.AgentOptions())
        agent.send([c.ContentBlock(text=c.TextBlock(text="hello"))])
        await asyncio.wait_for(agent.when_idle(), 10)
        ends = [e.turn_end.reason for e in agent.session.events if e.HasField("turn_end")]
        assert ends[0].rejected.reason == "seen over TLS"
    finally:
        await app.stop(grace=1)
        await plugin.stop(0)


async def test_a_tls_plugin_is_refused_without_trusted_roots(tmp_path: Path) -> None:
    key, cert = await make_certificate(tmp_path)
    plugin = guard()
    port = await plugin.serve("127.0.0.1:0", tls_key=str(key), tls_cert=str(cert))
    app = App(Config(listen="127.0.0.1:0", store="memory"))  # system roots only
    await app.start()
    try:
        with pytest.raises(FailedPrecondition, match="cannot describe the plugin"):
            await app.plugins.register(f"tls://127.0.0.1:{port}", Overrides())
        with pytest.raises(FailedPrecondition):  # plaintext to a TLS port fails too
            await app.plugins.register(f"127.0.0.1:{port}", Overrides())
        assert app.plugins.list_plugins() == []
    finally:
        await app.stop(grace=1)
        await plugin.stop(0)
