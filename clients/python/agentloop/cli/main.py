"""agentloop: a command-line client of the agentloop gRPC service.

Subcommands create, list, talk to, watch, cancel and dispose agents; `agentloop.cli.verbs`
adds sessions, resume, fork, inject, steer, wait, plugins and the `--json` output.
Rendering lives in `agentloop.cli.render`; this module only parses arguments and makes
the calls, through the SDK's facade (`agentloop.Client`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import inspect
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from agentloop.cli import render
from agentloop.cli.acp_verb import add_acp_verb
from agentloop.cli.approvals import APPROVAL_KINDS, add_approval_verbs, on_send_event
from agentloop.cli.children import add_children_verb
from agentloop.cli.compact import add_compact_verb
from agentloop.cli.drain import add_drain_verb
from agentloop.cli.tool_sources import add_mcp_verb
from agentloop.cli.verbs import add_verbs, as_dict, completion_script, emit, out
from agentloop.cli.version import version
from agentloop.client import Client, connect
from agentloop.turns import Turn
from agentloop.v1 import agent_event_pb2, agent_pb2

DEFAULT_ADDRESS = "127.0.0.1:50051"
EXIT_RPC_ERROR = 2
EXIT_INTERRUPTED = 130

Command = Callable[[Client, argparse.Namespace], Awaitable[int]]
"""A verb: an async function of the facade and the parsed arguments; its exit code."""

BlockingCommand = Callable[[grpc.Channel, argparse.Namespace], int]
"""A verb on a blocking channel (still accepted: `main` opens one for it)."""


async def cmd_create(client: Client, args: argparse.Namespace) -> int:
    """`create`: create an agent on a new session and print what was created."""
    options = agent_pb2.AgentOptions(
        provider=args.provider, model=args.model, tools=args.tool, persona=args.persona
    )
    if args.max_parallel_tool_calls is not None:
        options.max_parallel_tool_calls = args.max_parallel_tool_calls
    options.approval_required_tools.extend(args.approval_required)
    agent = await client.create(args.agent_id, options, session_id=args.session_id, cwd=args.cwd)
    text = f"agent    {agent.agent_id}\nsession  {agent.session_id}\n"
    emit(args, agent, text + f"status   {render.status_word(agent.status)}\n")
    return 0


async def cmd_agents(client: Client, args: argparse.Namespace) -> int:
    """`agents`: a table of every live agent, following pagination."""
    agents = await client.list_agents()
    emit(args, {"agents": [as_dict(a) for a in agents]}, render.agents_table(agents) + "\n")
    return 0


async def cmd_dispose(client: Client, args: argparse.Namespace) -> int:
    """`dispose`: stop an agent; its session stays readable."""
    agent = await client.dispose(args.agent_id)
    emit(args, agent, f"disposed {agent.agent_id} (session {agent.session_id})\n")
    return 0


async def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    """`cancel`: abort the running turn and drop queued messages."""
    response = await client.cancel(args.agent_id, args.reason)
    text = "cancelled\n" if response.cancelled else "nothing to cancel: the agent is idle\n"
    emit(args, response, text)
    return 0


async def cmd_send(client: Client, args: argparse.Namespace) -> int:
    """`send`: send (or steer) a message and render the turn that answers it.

    The facade finds the answering turn (by the message's request id) and reconnects
    a broken stream. Ctrl-C cancels the turn and keeps reading until it ends (or
    until the message shows as dropped); a second Ctrl-C quits.
    """
    turn = await client.send(args.agent_id, args.text, steer=args.steer)
    view = render.TurnView(color=sys.stdout.isatty() and "NO_COLOR" not in os.environ)
    reader = asyncio.ensure_future(show_turn(client, turn, view, args))
    cancelling: list[asyncio.Future[Any]] = []

    def interrupt() -> None:
        if cancelling:  # the second Ctrl-C
            reader.cancel()
            return
        out(view.finish())
        print("^C cancelling the turn (Ctrl-C again to quit)", file=sys.stderr)
        cancelling.append(asyncio.ensure_future(client.cancel(args.agent_id, "user interrupt")))

    with on_interrupt(interrupt):
        try:
            code = await reader
        except asyncio.CancelledError:
            if not reader.cancelled():
                raise
            out(view.finish())
            return EXIT_INTERRUPTED
        finally:
            for call in cancelling:
                if reader.cancelled():  # quitting: do not wait for the cancel
                    call.cancel()
                    with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                        await call
                else:
                    await call  # its error, if it failed, is the command's
    return code


async def show_turn(
    client: Client, turn: Turn, view: render.TurnView, args: argparse.Namespace
) -> int:
    """Render a turn's events as they come (answering approvals); 0 when it succeeded.

    Its sub-agents' progress (`child_progress`) shows under the call that made them.
    """

    def on_agent_event(agent_event: agent_event_pb2.AgentEvent) -> None:
        if agent_event.HasField("child_progress"):
            if args.json:
                emit(args, agent_event, "")
            else:
                out(view.progress(agent_event.child_progress))

    turn.on_agent_event = on_agent_event
    async for event in turn:
        emit(args, event, "") if args.json else out(view.render(event))
        if event.WhichOneof("payload") in APPROVAL_KINDS and not args.json:
            out(view.finish())
            await on_send_event(client, args, event)
    if turn.end is not None:
        return 0 if render.turn_succeeded(turn.end.turn_end) else 1
    if turn.dropped is None:
        out(view.finish())
        print("agentloop: the stream ended before the turn did", file=sys.stderr)
    return 1


@contextlib.contextmanager
def on_interrupt(handler: Callable[[], object]) -> Iterator[None]:
    """Call `handler` on SIGINT (where the loop supports it) instead of raising."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, handler)
    except (NotImplementedError, RuntimeError):  # no signal handlers here: Ctrl-C quits
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def cmd_tail(client: Client, args: argparse.Namespace) -> int:
    """`tail`: print every session event (and live agent event) one line each."""
    stream = client.stream(
        agent_id=args.agent_id,
        session_id=args.session_id,
        from_seq=args.from_seq,
        replay_only=args.no_follow,
    )

    async def follow() -> None:
        async for batch in stream.batches():
            for event in batch.events:
                emit(args, event, render.event_line(event) + "\n")
            for agent_event in batch.agent_events:
                emit(args, agent_event, render.agent_event_line(agent_event) + "\n")

    reader = asyncio.ensure_future(follow())
    with on_interrupt(reader.cancel):
        try:
            await reader
        except asyncio.CancelledError:
            if not reader.cancelled():
                raise  # Ctrl-C is the normal way to stop following
        finally:
            stream.close()
    return 0


def absolute(path: str) -> str:
    """The server wants an absolute cwd; resolving it here lets users pass "."."""
    return os.path.abspath(path) if path else ""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: global options and one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="agentloop", description="Command-line client of the agentloop gRPC service."
    )
    parser.add_argument(
        "--address",
        default=os.environ.get("AGENTLOOP_ADDRESS", DEFAULT_ADDRESS),
        help="server host:port (default: $AGENTLOOP_ADDRESS or %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="deadline of unary calls, seconds"
    )
    parser.add_argument(
        "--ca-file",
        default=os.environ.get("AGENTLOOP_CA_FILE", ""),
        help="PEM roots of the server's certificate: connect over TLS ($AGENTLOOP_CA_FILE)",
    )
    parser.add_argument(
        "--cert-file",
        default=os.environ.get("AGENTLOOP_CERT_FILE", ""),
        help="this client's PEM certificate, for mutual TLS ($AGENTLOOP_CERT_FILE)",
    )
    parser.add_argument(
        "--key-file",
        default=os.environ.get("AGENTLOOP_KEY_FILE", ""),
        help="the private key of --cert-file ($AGENTLOOP_KEY_FILE)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("AGENTLOOP_TOKEN", ""),
        help="the server's bearer token (default: $AGENTLOOP_TOKEN)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print responses as JSON (one object per line)"
    )
    parser.add_argument("--version", action="version", version=f"agentloop {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Command | BlockingCommand, help_text: str
    ) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(handler=handler)
        return cmd

    create = command("create", cmd_create, "create an agent on a new session")
    create.add_argument("agent_id", metavar="AGENT_ID")
    create.add_argument("--session-id", default="", help="new session id (default: generated)")
    create.add_argument("--provider", default="", help="model provider (default: server's)")
    create.add_argument("--model", default="", help="model name (default: provider's)")
    create.add_argument(
        "--tool", action="append", default=[], metavar="NAME", help="built-in tool (repeatable)"
    )
    create.add_argument("--cwd", default="", type=absolute, help="the agent's working directory")
    create.add_argument("--persona", default="", help="persona section of the system prompt")
    create.add_argument("--max-parallel-tool-calls", type=int, metavar="N")
    create.add_argument(
        "--approval-required", action="append", default=[], metavar="TOOL",
        help="a tool whose every call waits for approval (repeatable)",
    )  # fmt: skip

    send = command("send", cmd_send, "send a message and stream the turn that answers it")
    send.add_argument("agent_id", metavar="AGENT_ID")
    send.add_argument("text", metavar="TEXT")
    send.add_argument("--steer", action="store_true", help="steer the running turn instead")

    command("agents", cmd_agents, "list the live agents")

    tail = command("tail", cmd_tail, "print session events as they happen")
    tail.add_argument("agent_id", metavar="AGENT_ID", nargs="?")
    tail.add_argument("--from", dest="from_seq", type=int, default=0, metavar="SEQ")
    tail.add_argument("--session-id", default="", help="read a session instead of an agent")
    tail.add_argument("--no-follow", action="store_true", help="stop at the end of the log")

    dispose = command("dispose", cmd_dispose, "dispose an agent")
    dispose.add_argument("agent_id", metavar="AGENT_ID")

    cancel = command("cancel", cmd_cancel, "cancel the running turn")
    cancel.add_argument("agent_id", metavar="AGENT_ID")
    cancel.add_argument("--reason", default="", help="recorded on the aborted turn")

    add_verbs(command)
    add_approval_verbs(command)
    add_acp_verb(command)
    add_compact_verb(command)
    add_drain_verb(command)
    add_children_verb(command)
    add_mcp_verb(command)
    completion = command("completion", cmd_completion, "print a shell completion script")
    completion.add_argument("shell", choices=("bash",))
    return parser


def cmd_completion(_channel: grpc.Channel, _args: argparse.Namespace) -> int:
    """`completion bash`: `main` prints the script without connecting."""
    raise AssertionError("main handles completion")


def report_rpc_error(error: grpc.RpcError, address: str) -> int:
    """Print a failed call on stderr; returns the exit code."""
    is_call = isinstance(error, grpc.Call | grpc.aio.AioRpcError)
    code = error.code() if is_call else grpc.StatusCode.UNKNOWN
    if code == grpc.StatusCode.UNAVAILABLE:
        print(
            f"agentloop: cannot reach agentloop at {address}: is the server running? (make run)",
            file=sys.stderr,
        )
    else:
        details = error.details() if is_call else str(error)
        print(f"agentloop: {code.name}: {details}", file=sys.stderr)
    return EXIT_RPC_ERROR


class CallDetails(
    collections.namedtuple(
        "CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    """Call details with our metadata added (grpc's own type cannot be built)."""


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> CallDetails:
        return CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or ()), self._metadata],
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        """Send a unary call with the token."""
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        """Send a streaming call with the token."""
        return continuation(self._with_token(details), request)


def open_channel(args: argparse.Namespace) -> grpc.Channel:
    """A blocking channel for a `BlockingCommand`.

    Plaintext, or TLS when a CA file or a client certificate is given.
    """
    if not (args.ca_file or args.cert_file):
        return grpc.insecure_channel(args.address)

    def read(path: str) -> bytes | None:
        return Path(path).read_bytes() if path else None

    credentials = grpc.ssl_channel_credentials(
        read(args.ca_file), read(args.key_file), read(args.cert_file)
    )
    return grpc.secure_channel(args.address, credentials)


def main(argv: list[str] | None = None) -> int:
    """Run one command.

    Args:
        argv: The arguments without the program name; None means `sys.argv[1:]`.

    Returns:
        The exit code: 0 on success, 1 when a turn failed, 2 on a gRPC error.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "tail" and bool(args.agent_id) == bool(args.session_id):
        parser.error("tail needs exactly one of AGENT_ID or --session-id")
    if args.command == "sessions" and args.action == "delete" and not args.session_id:
        parser.error("sessions delete needs a SESSION_ID")
    handler: Command | BlockingCommand = args.handler
    if args.command == "completion":  # needs no server
        out(completion_script(parser))
        return 0
    try:
        verb: Any = handler
        if inspect.iscoroutinefunction(verb):
            return asyncio.run(run(verb, args))
        blocking: Any = handler
        with open_channel(args) as channel:
            token = args.token.strip()
            if token:  # the server's bearer token, sent on every call
                authorized = grpc.intercept_channel(channel, BearerToken(token))
                return int(blocking(authorized, args))
            return int(blocking(channel, args))
    except grpc.RpcError as error:
        return report_rpc_error(error, args.address)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `agentloop tail | head`: the reader left; silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as error:  # an unreadable --ca-file, --cert-file or --key-file
        print(f"agentloop: cannot read {error.filename}: {error.strerror}", file=sys.stderr)
        return EXIT_RPC_ERROR


async def run(handler: Command, args: argparse.Namespace) -> int:
    """Connect with the global options and run one verb."""
    client = connect(
        args.address,
        token=args.token.strip(),  # the server's bearer token, sent on every call
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file,
        timeout=args.timeout,
    )
    try:
        return await handler(client, args)
    finally:
        await client.close()


if __name__ == "__main__":
    sys.exit(main())
