"""The log formats, the context fields and the rate limit of repeated warnings."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.observability.logs import JsonFormatter, RateLimited, TextFormatter, fields
from server.settings.config import ConfigError, parse_config


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("tests.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, stream, handler
    logger.removeHandler(handler)
    logger.propagate = True


def test_json_lines_carry_the_fields(captured) -> None:
    logger, stream, handler = captured
    handler.setFormatter(JsonFormatter())
    logger.warning("turn %d failed", 3, extra=fields(agent="a1", session="s", turn=3, step=2))
    logger.info("no context")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "turn 3 failed" and first["level"] == "WARNING"
    assert (first["agent"], first["session"], first["turn"], first["step"]) == ("a1", "s", 3, 2)
    assert "agent" not in second and second["logger"] == "tests.logs"


def test_text_lines_put_the_fields_after_the_message(captured) -> None:
    logger, stream, handler = captured
    handler.setFormatter(TextFormatter())
    logger.info("plugin registered", extra=fields(plugin="p 1", agent=None, turn=""))
    line = stream.getvalue().strip()
    assert line.endswith('INFO tests.logs: plugin registered plugin="p 1"')


def test_repeated_warnings_are_rate_limited(captured) -> None:
    logger, stream, handler = captured
    handler.setFormatter(JsonFormatter())
    limited = RateLimited(logger, interval=3600)
    for _ in range(50):
        limited.log(logging.WARNING, ("p", "seam"), "plugin %s down", "p")
    limited.log(logging.WARNING, ("q", "seam"), "plugin %s down", "q")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["message"] for line in lines] == ["plugin p down", "plugin q down"]
    limited.interval = 0  # the next line of p says how many were left out
    limited.log(logging.WARNING, ("p", "seam"), "plugin %s down", "p")
    last = json.loads(stream.getvalue().splitlines()[-1])
    assert last["suppressed"] == 49


def test_observability_config() -> None:
    config = parse_config({"logFormat": "json", "metricsListen": 9464, "traceExporter": "otlp"})
    assert (config.log_format, config.metrics_listen, config.trace_exporter) == (
        "json", "127.0.0.1:9464", "otlp"
    )  # fmt: skip
    assert parse_config({"metricsListen": "0.0.0.0:9000"}).metrics_listen == "0.0.0.0:9000"
    assert parse_config({}).metrics_listen == ""
    with pytest.raises(ConfigError, match="logFormat"):
        parse_config({"logFormat": "xml"})
    with pytest.raises(ConfigError, match="metricsListen"):
        parse_config({"metricsListen": "nowhere"})
    with pytest.raises(ConfigError, match="traceExporter"):
        parse_config({"traceExporter": "zipkin"})
    with pytest.raises(ConfigError, match="maxTokensField"):
        parse_config({"providers": [{"name": "o", "baseUrl": "http://x", "maxTokensField": "n"}]})


def test_an_invalid_config_under_json_logs_is_refused_as_a_json_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before logging is set up, `--log-format json` alone decides how the refusal reads."""
    from server.__main__ import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: [not, an, address]\n")

    assert main(["--config", str(bad), "--log-format", "json"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and "invalid config" in record["message"], record

    assert main(["--config", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("agentloop: invalid config: ")
