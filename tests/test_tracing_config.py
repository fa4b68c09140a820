"""Which trace exporter is in force: the config's, else the standard OTEL_* variables."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from server.observability.exporters import exporter_name
from server.observability.tracing import Tracing, build_exporter


def test_the_config_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert exporter_name("") == "console"
    assert exporter_name("none") == "none"
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    assert exporter_name("") == "none"  # off by default
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert exporter_name("otlp") == "none"


def test_exporters_are_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    assert build_exporter("none", "") is None
    assert isinstance(build_exporter("console", ""), ConsoleSpanExporter)
    otlp = build_exporter("otlp", "http://127.0.0.1:4317")
    assert type(otlp).__name__ == "OTLPSpanExporter"
    assert otlp is not None
    otlp.shutdown()
    with pytest.raises(ValueError, match="zipkin"):
        build_exporter("zipkin", "")
    assert Tracing.from_config("", "") is None
    tracing = Tracing.from_config("otlp", "http://127.0.0.1:4317")
    assert tracing is not None
    tracing.shutdown()  # no spans: nothing to send, returns at once
