"""A stdio MCP server's stderr, line by line into the log.

The process writes into a pipe; a reader thread logs each line (cut to `MAX_LINE`)
under `server.mcp.stderr`, naming the server, until the process closes its end.
A thread, not the event loop: a server that floods its stderr costs the loop nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import BinaryIO, TextIO

log = logging.getLogger("server.mcp.stderr")

MAX_LINE = 2000
"""The most characters of one stderr line that reach the log."""


class StderrLog:
    """One process's stderr pipe: `writer` goes to the process, lines come to the log."""

    def __init__(self, server: str) -> None:
        read_fd, write_fd = os.pipe()
        self.writer: TextIO = os.fdopen(write_fd, "w")
        """The end the process writes to (the `errlog` of the stdio transport)."""
        reader = os.fdopen(read_fd, "rb")
        self._thread = threading.Thread(
            target=_pump, args=(reader, server), name=f"mcp-stderr-{server}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Close this side's copy of the write end; the reader ends when the process's does."""
        self.writer.close()


def _pump(reader: BinaryIO, server: str) -> None:
    with reader:
        for raw in reader:
            line = raw.decode(errors="replace").rstrip()
            if line:
                log.info("MCP server %s stderr: %s", server, line[:MAX_LINE])
