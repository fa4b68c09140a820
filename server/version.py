"""The version of this installation."""

from __future__ import annotations


def version() -> str:
    """The installed package's version; `0+unknown` in a tree never installed."""
    # Imported here: importlib.metadata (and the email package under it) is a few MB a
    # default server, which never asks its version, need not hold.
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _installed

    try:
        return _installed("agentloop-server")
    except PackageNotFoundError:
        return "0+unknown"
