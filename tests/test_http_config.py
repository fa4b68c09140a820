"""`httpListen`: off by default, a bare port is loopback, a bad value names the field."""

from __future__ import annotations

import pytest

from server.settings.config import ConfigError, parse_config


def test_http_listen_is_off_by_default() -> None:
    assert parse_config({}).http_listen == ""


@pytest.mark.parametrize(
    ("value", "listen"),
    [(8080, "127.0.0.1:8080"), ("8080", "127.0.0.1:8080"), (":8080", "127.0.0.1:8080"),
     ("0.0.0.0:8443", "0.0.0.0:8443"), ("[::1]:8080", "[::1]:8080")],
)  # fmt: skip
def test_a_bare_port_is_loopback(value: object, listen: str) -> None:
    assert parse_config({"httpListen": value}).http_listen == listen


@pytest.mark.parametrize("value", ["host:port", "localhost:99999", True, ["8080"]])
def test_a_bad_http_listen_names_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^httpListen: "):
        parse_config({"httpListen": value})
