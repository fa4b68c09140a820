"""`python -m server`: run the agentloop gRPC server."""

from __future__ import annotations

import argparse
import logging
import sys

from server.edge import event_loop
from server.edge.app import App
from server.memory import freeze_startup_heap
from server.observability.logs import LOG_FORMATS, JsonFormatter, setup_logging
from server.settings.config import (
    Config,
    ConfigError,
    http_address,
    load_config,
    metrics_address,
    override,
)
from server.version import version


class _Version(argparse.Action):
    """`--version`: the version is read only when asked (importlib.metadata is a few MB)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"agentloop {version()}")
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the config, serve until SIGTERM (or run `sessions ...`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sessions"]:  # offline work on a store: export, import
        from server.portable.command import main as sessions_main

        return sessions_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    parser.add_argument("--config", help="YAML config file (default: the embedded defaults)")
    parser.add_argument("--listen", help="host:port, overriding the config")
    parser.add_argument("--data-dir", help="directory of the SQLite store, overriding the config")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow listening beyond loopback without TLS and a token (anyone could register a"
        " plugin and read the traffic)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, help="text or json lines (default: the config's)"
    )
    parser.add_argument("--metrics-listen", help="host:port of the Prometheus endpoint")
    parser.add_argument(
        "--http-listen", help="host:port (or a port, on loopback) of the web console and JSON API"
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as error:  # before logging is set up: only the flag says the format
        refuse(f"agentloop: invalid config: {error}", json_lines=args.log_format == "json")
        return 2
    log_format = args.log_format or config.log_format
    stream = None
    if log_format == "json":  # nothing but JSON lines on stdout and stderr
        from server.observability.json_streams import capture

        stream = capture()
    setup_logging(args.log_level, log_format, stream)
    if log_format != config.log_format:
        config = override(config, log_format=log_format)
    try:
        if args.metrics_listen:
            config = override(config, metrics_listen=metrics_address(args.metrics_listen))
        if args.listen:
            config = override(config, listen=args.listen)
        if args.data_dir:
            config = override(config, data_dir=args.data_dir)
        if args.insecure:
            config = override(config, insecure=True)
        if args.http_listen:
            config = override(config, http_listen=http_address(args.http_listen))
    except ConfigError as error:
        print(f"agentloop: {error}", file=sys.stderr)
        return 2
    return event_loop.run(serve(config), config.event_loop)


async def serve(config: Config) -> int:
    """Start the app, print where it listens, and run until a signal."""
    try:
        app = App(config)
    except ConfigError as error:
        print(f"agentloop: invalid config: {error}", file=sys.stderr)
        return 2
    try:
        port = await app.start()
    except OSError as error:
        print(f"agentloop: {error}", file=sys.stderr)
        return 1
    freeze_startup_heap()
    requested = app.stop_on_signals()  # before announcing: a SIGTERM right after is graceful
    host = config.listen.rpartition(":")[0]
    announce(config, f"agentloop listening on {host}:{port}", listen=f"{host}:{port}")
    if app.http is not None:
        scheme = "https" if app.credentials is not None else "http"
        http_host = config.http_listen.rpartition(":")[0]
        url = f"{scheme}://{http_host}:{app.http.port}/"
        announce(config, f"agentloop console on {url}", console=url)
    await app.run_until(requested)
    return 0


def refuse(line: str, *, json_lines: bool) -> None:
    """Why the server will not start, on stderr: plain text, or a JSON record."""
    if json_lines:
        record = logging.LogRecord("server", logging.ERROR, __file__, 0, line, None, None)
        line = JsonFormatter().format(record)
    print(line, file=sys.stderr, flush=True)


def announce(config: Config, line: str, **fields: str) -> None:
    """A readiness line on stdout: plain text, or a JSON object under `logFormat: json`."""
    if config.log_format == "json":
        record = logging.LogRecord("server", logging.INFO, __file__, 0, line, None, None)
        record.__dict__.update(fields)
        line = JsonFormatter().format(record)
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
