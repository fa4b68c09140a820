"""gRPC's polled endpoints for plugin streams (`agentloop.plugin.polling`).

The server asks for them on the channels it opens, the plugin helper on the connections
it accepts, each before gRPC loads; an operator's own `GRPC_EXPERIMENTS` is left alone.
What they save is measured by `bench/pingpong_bench.py`, never asserted here.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentloop.plugin.polling import CLIENT, LISTENER, VARIABLE, prefer_polled_endpoints

ROOT = Path(__file__).resolve().parent.parent


def experiments_after(code: str, inherited: str | None = None) -> str | None:
    """`GRPC_EXPERIMENTS` in a fresh interpreter after `code` (and then grpc) loaded."""
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if inherited is not None:
        env[VARIABLE] = inherited
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT), str(ROOT / "clients" / "python")))
    script = f"{code}\nimport os, grpc\nprint(repr(os.environ.get({VARIABLE!r})))"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    value = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert value is None or isinstance(value, str)
    return value


def test_the_server_process_asks_for_polled_client_endpoints_only() -> None:
    # Its own listener (the public API) keeps gRPC's default.
    assert experiments_after("import server") == CLIENT
    # Importing the contract alone changes nothing: only the server and the helper ask.
    assert experiments_after("import agentloop.plugin.v1.hook_service_pb2") is None


def test_the_plugin_helper_asks_for_polled_listener_endpoints() -> None:
    assert experiments_after("from agentloop.plugin.sdk import Plugin") == LISTENER


def test_a_plugin_started_by_the_server_process_adds_its_own() -> None:
    inherited = experiments_after("from agentloop.plugin.sdk import Plugin", inherited=CLIENT)
    assert inherited == f"{CLIENT},{LISTENER}"


@pytest.mark.parametrize("operator", ["", "-event_engine_client,-some_other", "some_experiment"])
def test_an_operators_own_setting_is_left_alone(operator: str) -> None:
    assert experiments_after("import server", inherited=operator) == operator
    env = {VARIABLE: operator}
    assert prefer_polled_endpoints(LISTENER, env) is False
    assert env == {VARIABLE: operator}


def test_nothing_changes_once_grpc_has_loaded() -> None:
    import grpc  # noqa: F401  # loaded, as in this test process

    env: dict[str, str] = {}
    assert prefer_polled_endpoints(CLIENT, env) is False
    assert env == {}
    env = {VARIABLE: CLIENT}  # set before grpc loaded (here, or by the parent process)
    assert prefer_polled_endpoints(CLIENT, env) is True
    assert env == {VARIABLE: CLIENT}
