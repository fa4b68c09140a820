"""The version of the installed SDK distribution, which the CLI reports."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed

DISTRIBUTION = "agentloop-client"


def version() -> str:
    """The installed `agentloop-client` version; `0+unknown` in a tree never installed."""
    try:
        return _installed(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"
