"""The server's event loop: uvloop by default, asyncio's on request, a clear error else."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from server.edge import event_loop
from server.settings.config import Config, ConfigError, parse_config


def test_the_default_is_uvloop_and_asyncio_is_a_choice() -> None:
    assert Config().event_loop == "uvloop"
    assert event_loop.factory("uvloop") is uvloop.new_event_loop
    assert event_loop.factory("asyncio") is None  # asyncio.Runner's own default
    assert parse_config({"eventLoop": "asyncio"}).event_loop == "asyncio"


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_run_drives_a_coroutine_to_its_end_on_the_chosen_loop(choice: str) -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        return 1 if isinstance(loop, uvloop.Loop) else 0

    assert event_loop.run(main(), choice) == (choice == "uvloop")


def test_an_unknown_loop_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="eventLoop") as refused:
        parse_config({"eventLoop": "tokio"})
    assert "uvloop" in str(refused.value) and "asyncio" in str(refused.value)


def test_without_uvloop_the_server_says_so_and_runs_on_asyncio(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # its import fails
    assert event_loop.factory("uvloop") is None
    assert "uvloop is not installed" in caplog.text
