"""The build backend of `agentloop-server`: setuptools, plus where the SDK comes from.

The server depends on `agentloop-client` (clients/python), which is on no index. Built
from a checkout into an environment that does not have the SDK yet (`pip install .`),
the metadata pip resolves names the checkout's `clients/python` directly, so pip
installs it from there; anywhere else (the SDK installed already, as `make setup` does
first, or a source tree without clients/python) the requirement stays a plain one.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  # every hook setuptools has

SDK = "agentloop-client"
SOURCE = Path(__file__).resolve().parent.parent / "clients" / "python"


def _sdk_installed() -> bool:
    """Whether the environment being installed into has the SDK.

    pip runs the hooks with that environment's interpreter, its packages hidden from
    `sys.path`, so they are looked for where it keeps them.
    """
    site = Path(sysconfig.get_path("purelib"))
    return any(site.glob("agentloop_client-*.dist-info"))


def _point_at_checkout(metadata_directory: str, dist_info: str) -> None:
    if _sdk_installed() or not (SOURCE / "pyproject.toml").is_file():
        return
    path = Path(metadata_directory) / dist_info / "METADATA"
    lines = path.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(f"Requires-Dist: {SDK}") and "@" not in line:
            lines[i] = f"Requires-Dist: {SDK} @ {SOURCE.as_uri()}\n"
    path.write_text("".join(lines))


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: dict[str, Any] | None = None
) -> str:
    """The metadata setuptools writes, the SDK taken from the checkout if missing."""
    dist_info = _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    _point_at_checkout(metadata_directory, dist_info)
    return dist_info


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: dict[str, Any] | None = None
) -> str:
    """As `prepare_metadata_for_build_wheel`, for an editable install."""
    dist_info = _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)
    _point_at_checkout(metadata_directory, dist_info)
    return dist_info
