"""Structured logs: one format, plain text or JSON lines, with context as fields.

A log call passes its context with `extra=fields(agent=..., turn=...)`; the formatter
writes those fields after the message (`key=value` in text) or as JSON keys, never
mixed into the message. Repeated warnings go through `RateLimited`, which writes the
first, then at most one per interval with the count of those left out.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

FIELDS = ("agent", "session", "turn", "step", "plugin", "seam")
"""The context fields a record may carry, in the order text lines show them."""
ACCESS_FIELDS = ("method", "code", "duration_ms", "peer")
"""The fields of an access line (one per RPC)."""
LOG_FORMATS = ("text", "json")

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)))
_SET_LATER = frozenset({"message", "asctime"})
"""Set on a record by formatting it."""


def fields(**values: object) -> dict[str, object]:
    """`extra=` for a log call: the given context fields that are set (not None/empty)."""
    return {key: value for key, value in values.items() if value is not None and value != ""}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and k not in _SET_LATER}


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...`: the default, for humans."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The line, with the record's context fields appended."""
        line = super().format(record)
        extras = _extras(record)
        if not extras:
            return line
        pairs = " ".join(f"{k}={_text(v)}" for k, v in extras.items())
        head, newline, rest = line.partition("\n")  # a traceback stays below the fields
        return f"{head} {pairs}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            out[key] = value if isinstance(value, int | float | bool | str) else str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _text(value: object) -> str:
    text = str(value)
    return json.dumps(text) if not text or any(ch in text for ch in ' ="\n') else text


def setup_logging(
    level: str = "INFO", log_format: str = "text", stream: TextIO | None = None
) -> None:
    """Install one handler on the root logger writing `log_format` ("text" or "json")."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


class RateLimited:
    """Lines of one kind (per key) at most once per `interval` seconds, counting the rest."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[object, float] = {}
        self._skipped: dict[object, int] = {}

    def log(
        self,
        level: int,
        key: object,
        message: str,
        *args: object,
        extra: dict[str, object] | None = None,
    ) -> None:
        """Log now unless a line of `key` was written less than `interval` seconds ago."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return
        if len(self._last) > 10_000:  # keys are plugins and seams; bound them anyway
            self._last.clear()
            self._skipped.clear()
        self._last[key] = now
        skipped = self._skipped.pop(key, 0)
        merged = dict(extra or {})
        if skipped:
            merged["suppressed"] = skipped
        self.logger.log(level, message, *args, extra=merged)
