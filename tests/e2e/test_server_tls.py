"""TLS and mutual TLS on the server's own port, end to end with a CA made here: the
server, the Python client facade and the CLI."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from agentloop.client import connect
from agentloop.v1 import agent_factory_service_pb2 as fac
from server.edge.app import App
from server.settings.config import Config, ConfigError
from tests.e2e.conftest import READ_TIMEOUT, running_app
from tests.processes import REPO, token_free_env

T = READ_TIMEOUT
TOKEN = "tls-client-token"

pytestmark = pytest.mark.usefixtures("without_tokens")


async def openssl(*args: str) -> None:
    """Run the openssl binary; fail the test with its stderr."""
    process = await asyncio.create_subprocess_exec(
        "openssl", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()


@dataclass
class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


async def issue(directory: Path, ca: Path, ca_key: Path, name: str, extensions: str) -> None:
    """A P-256 key `<name>.key` and its certificate `<name>.crt`, signed by the CA."""
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext_file = directory / f"{name}.ext"
    ext_file.write_text(extensions + "\n")
    await openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
    )  # fmt: skip
    await openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "1", "-out", str(cert), "-extfile", str(ext_file),
    )  # fmt: skip


@pytest.fixture
async def pki(tmp_path: Path) -> Pki:
    """A fresh CA and the certificates it issues (the README's openssl steps)."""
    ca, ca_key = tmp_path / "ca.crt", tmp_path / "ca.key"
    await openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "1", "-keyout", str(ca_key), "-out", str(ca), "-subj", "/CN=agentloop test CA",
    )  # fmt: skip
    await issue(tmp_path, ca, ca_key, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost")
    await issue(tmp_path, ca, ca_key, "client", "extendedKeyUsage=clientAuth")
    return Pki(
        ca, tmp_path / "server.crt", tmp_path / "server.key",
        tmp_path / "client.crt", tmp_path / "client.key",
    )  # fmt: skip


def tls_config(pki: Pki, tmp_path: Path, mutual: bool) -> Config:
    """A TLS server on 127.0.0.1:0 requiring TOKEN (and client certificates if `mutual`)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    return Config(
        listen="127.0.0.1:0",
        store="memory",
        agents=(),
        token_file=str(token_file),
        tls_cert_file=str(pki.server_cert),
        tls_key_file=str(pki.server_key),
        tls_client_ca_file=str(pki.ca) if mutual else "",
    )


async def cli(port: int, *args: str) -> tuple[int, str]:
    """`python -m agentloop.cli --address 127.0.0.1:PORT ARGS` with the token; (code, output)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentloop.cli", "--address", f"127.0.0.1:{port}", *args,
        cwd=REPO, env=token_free_env(AGENTLOOP_TOKEN=TOKEN),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), T)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_tls_with_a_token_end_to_end(pki: Pki, tmp_path: Path) -> None:
    async with running_app(tls_config(pki, tmp_path, mutual=False)) as e2e:
        client = connect(f"127.0.0.1:{e2e.port}", token=TOKEN, ca_file=str(pki.ca))
        try:
            created = await client.factory.CreateAgent(
                fac.CreateAgentRequest(agent_id="over-tls"), timeout=T
            )
            assert created.agent.agent_id == "over-tls"
        finally:
            await client.close()
        # Plaintext does not reach a TLS port (the fixture's own channel is plaintext).
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await e2e.factory.ListAgents(fac.ListAgentsRequest(), timeout=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        code, output = await cli(e2e.port, "--ca-file", str(pki.ca), "agents")
        assert code == 0, output
        assert "over-tls" in output
        code, output = await cli(e2e.port, "agents")  # plaintext: refused
        assert code != 0 and "cannot reach agentloop" in output, output


async def test_mutual_tls_needs_a_client_certificate(pki: Pki, tmp_path: Path) -> None:
    async with running_app(tls_config(pki, tmp_path, mutual=True)) as e2e:
        address = f"127.0.0.1:{e2e.port}"
        anonymous = connect(address, token=TOKEN, ca_file=str(pki.ca))
        try:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await anonymous.factory.ListAgents(fac.ListAgentsRequest(), timeout=T)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await anonymous.close()
        certified = connect(
            address,
            token=TOKEN,
            ca_file=str(pki.ca),
            cert_file=str(pki.client_cert),
            key_file=str(pki.client_key),
        )
        try:
            await certified.factory.CreateAgent(fac.CreateAgentRequest(agent_id="m"), timeout=T)
        finally:
            await certified.close()
        certificate = ("--cert-file", str(pki.client_cert), "--key-file", str(pki.client_key))
        code, output = await cli(e2e.port, "--ca-file", str(pki.ca), *certificate, "agents")
        assert code == 0, output
        assert "m" in output.split()
        code, output = await cli(e2e.port, "--ca-file", str(pki.ca), "agents")
        assert code != 0, output


async def test_a_port_beyond_loopback_needs_tls_and_a_token(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exposed = Config(listen="0.0.0.0:0", store="memory", agents=())
    with monkeypatch.context() as env:
        env.setenv("AGENTLOOP_TOKEN", TOKEN)
        with pytest.raises(ConfigError, match=r"set TLS \(tlsCertFile and tlsKeyFile\)"):
            App(exposed)
    secured = replace(tls_config(pki, tmp_path, mutual=False), listen="0.0.0.0:0")
    App(secured)  # TLS and a token: accepted
    with pytest.raises(ConfigError, match=r"a token \(tokenFile or \$AGENTLOOP_TOKEN\)"):
        App(replace(secured, token_file=""))
    mutual = replace(tls_config(pki, tmp_path, mutual=True), listen="0.0.0.0:0", token_file="")
    App(mutual)  # client certificates instead of a token: accepted
    App(replace(exposed, insecure=True))
