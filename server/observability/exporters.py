"""Which trace exporter is in force, read without loading the OpenTelemetry SDK."""

from __future__ import annotations

import os


def exporter_name(configured: str) -> str:
    """The exporter in force: the config's, else `$OTEL_TRACES_EXPORTER`, else none."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return "none"
    return configured or os.environ.get("OTEL_TRACES_EXPORTER", "none").split(",")[0].strip()
