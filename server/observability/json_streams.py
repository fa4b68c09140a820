"""`--log-format json`: nothing but JSON lines on the server's stdout and stderr.

Log records are JSON already (`logs.JsonFormatter`). What does not go through logging
is brought under it here:

- Python warnings (`warnings.warn`) become records of the `py.warnings` logger;
- an uncaught exception, in the main thread or another, becomes one CRITICAL record
  with its traceback in `exception`, not a multi-line traceback;
- whatever is written to file descriptor 2 by anything else (gRPC's C core, a
  library's `print(file=sys.stderr)`, a child process that inherited it) is read
  from a pipe, one line at a time, and written as a WARNING record of the `stderr`
  logger, with the line as its message.

The log handler writes to the original stderr (a duplicate of descriptor 2 taken
before the pipe replaced it), so its own lines never pass through the pipe.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from types import TracebackType
from typing import TextIO

log = logging.getLogger("stderr")


def capture() -> TextIO:
    """Bring stderr, warnings and uncaught exceptions under JSON logging.

    Returns the stream the log handler must write to (the original stderr).
    """
    sys.stderr.flush()
    original = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    sys.stderr = os.fdopen(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    reader = threading.Thread(target=_relay, args=(read_end,), name="stderr-json", daemon=True)
    reader.start()
    logging.captureWarnings(True)
    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread

    def restore() -> None:  # at exit: the last lines get out before the process ends
        sys.stderr.flush()
        os.dup2(original.fileno(), 2)  # the pipe's last writer here goes: the reader sees EOF
        reader.join(timeout=1.0)

    atexit.register(restore)
    return original


def _relay(read_end: int) -> None:
    with os.fdopen(read_end, "rb") as pipe:
        for raw in pipe:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if line.strip():
                log.warning(line)


def _uncaught(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    logging.getLogger("server").critical("uncaught %s: %s", kind.__name__, error,
                                         exc_info=(kind, error, trace))  # fmt: skip


def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    error = args.exc_value or args.exc_type()
    logging.getLogger("server").critical(
        "uncaught %s in thread %s: %s",
        args.exc_type.__name__,
        args.thread.name if args.thread else "?",
        error,
        exc_info=(args.exc_type, error, args.exc_traceback),
    )
