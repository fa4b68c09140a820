"""The version of this installation."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed


def version() -> str:
    """The installed package's version; `0+unknown` in a tree never installed."""
    try:
        return _installed("agentloop-server")
    except PackageNotFoundError:
        return "0+unknown"
