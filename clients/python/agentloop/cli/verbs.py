"""The CLI's verbs beyond talking to one agent, and the `--json` output of every verb.

The verbs: sessions, resume, fork, inject, steer, wait, plugins, shell completion.

With `--json`, a verb prints its response as one JSON object (field names as in the
proto), and a streaming verb prints one object per event, one per line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from agentloop.cli import render
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.plugin.v1 import plugin_registry_service_pb2_grpc as reg_grpc
from agentloop.v1 import (
    agent_factory_service_pb2,
    agent_factory_service_pb2_grpc,
    agent_pb2,
    agent_service_pb2,
    agent_service_pb2_grpc,
)

Command = Callable[[grpc.Channel, argparse.Namespace], int]


def out(text: str) -> None:
    """Write and flush at once, so that streamed text appears as it arrives."""
    sys.stdout.write(text)
    sys.stdout.flush()


def as_dict(message: Message) -> dict[str, Any]:
    """A message as JSON-ready data, with the proto's field names and every field."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def emit(args: argparse.Namespace, message: Message | dict[str, Any], text: str) -> None:
    """Print `message` as one JSON line with `--json`, else `text`."""
    if args.json:
        data = as_dict(message) if isinstance(message, Message) else message
        out(json.dumps(data, ensure_ascii=False) + "\n")
    else:
        out(text)


def _agents(channel: grpc.Channel) -> agent_service_pb2_grpc.AgentServiceStub:
    return agent_service_pb2_grpc.AgentServiceStub(channel)


def cmd_sessions(channel: grpc.Channel, args: argparse.Namespace) -> int:
    """`sessions`: every stored session, following pagination."""
    sessions: list[Any] = []
    token = ""
    while True:
        page = _agents(channel).ListSessions(
            agent_service_pb2.ListSessionsRequest(page_token=token), timeout=args.timeout
        )
        sessions.extend(page.sessions)
        token = page.next_page_token
        if not token:
            break
    width = max([len("SESSION"), *(len(s.session_id) for s in sessions)])
    rows = [f"{'SESSION':<{width}}  EVENTS"]
    rows += [f"{s.session_id:<{width}}  {s.event_count}" for s in sessions]
    emit(args, {"sessions": [as_dict(s) for s in sessions]}, "\n".join(rows) + "\n")
    return 0


def cmd_resume(channel: grpc.Channel, args: argparse.Namespace) -> int:
    """`resume`: a new agent driving a stored session."""
    options = agent_pb2.AgentOptions(provider=args.provider, model=args.model, tools=args.tool)
    agent = (
        agent_factory_service_pb2_grpc.AgentFactoryServiceStub(channel)
        .ResumeAgent(
            agent_factory_service_pb2.ResumeAgentRequest(
                agent_id=args.agent_id, session_id=args.session_id, options=options
            ),
            timeout=args.timeout,
        )
        .agent
    )
    text = f"agent    {agent.agent_id}\nsession  {agent.session_id}\n"
    emit(args, agent, text + f"status   {render.status_word(agent.status)}\n")
    return 0


def cmd_fork(channel: grpc.Channel, args: argparse.Namespace) -> int:
    """`fork`: copy a session (up to a sequence number) into a new one."""
    request = agent_service_pb2.ForkSessionRequest(
        session_id=args.session_id, new_session_id=args.new_session_id
    )
    if args.at is not None:
        request.boundary_seq = args.at
    session = _agents(channel).ForkSession(request, timeout=args.timeout).session
    emit(args, session, f"forked into {session.session_id}\n")
    return 0


def cmd_inject(channel: grpc.Channel, args: argparse.Namespace) -> int:
    """`inject`: add context to an agent's session (it reaches the next model request)."""
    response = _agents(channel).InjectContext(
        agent_service_pb2.InjectContextRequest(agent_id=args.agent_id, text=args.text),
        timeout=args.timeout,
    )
    emit(args, response, f"injected (next seq {response.next_seq})\n")
    return 0


def cmd_steer(channel: grpc.Channel, args: argparse.Namespace) -> int:
    """`steer`: steer the running turn, or queue a message when the agent is idle."""
    response = _agents(channel).SteerMessage(
        agent_service_pb2.SteerMessageRequest(agent_id=args.agent_id, text=args.text),
        timeout=args.timeout,
    )
    what = "steering the running turn" if response.steering else "queued as a new message"
    emit(args, response, f"{what} (next seq {response.next_seq})\n")
    return 0


def cmd_wait(channel: grpc.Channel, args: argparse.Namespace) -> int:
    """`wait`: block until the agent is idle (exit 1 when the wait timed out)."""
    request = agent_service_pb2.WaitIdleRequest(agent_id=args.agent_id)
    if args.wait_timeout is not None:
        request.timeout.FromNanoseconds(int(args.wait_timeout * 1e9))
    deadline = (args.wait_timeout or 0) + args.timeout
    response = _agents(channel).WaitIdle(request, timeout=deadline)
    word = render.status_word(response.status)
    emit(args, response, ("idle" if response.idle else f"not idle ({word})") + "\n")
    return 0 if response.idle else 1


def cmd_plugins(channel: grpc.Channel, args: argparse.Namespace) -> int:
    """`plugins [list|register ADDRESS|unregister NAME]`."""
    stub = reg_grpc.PluginRegistryServiceStub(channel)
    if args.action == "register":
        request = reg.RegisterPluginRequest(address=args.target)
        if args.order is not None:
            request.order = args.order
        plugin = stub.RegisterPlugin(request, timeout=args.timeout).plugin
        emit(args, plugin, f"registered {plugin.name} {plugin.version} at {plugin.address}\n")
        return 0
    if args.action == "unregister":
        response = stub.UnregisterPlugin(
            reg.UnregisterPluginRequest(name=args.target), timeout=args.timeout
        )
        emit(args, response, f"unregistered {args.target}\n")
        return 0
    listed = stub.ListPlugins(reg.ListPluginsRequest(), timeout=args.timeout)
    rows = [f"{'PLUGIN':<24} {'STATE':<12} {'CALLS':>7} ADDRESS"]
    for plugin in listed.plugins:
        state = render.word_of(reg.PluginState.Name, plugin.state, "PLUGIN_STATE_")
        rows.append(f"{plugin.name:<24} {state:<12} {plugin.stats.calls:>7} {plugin.address}")
    emit(args, listed, "\n".join(rows) + "\n")
    return 0


def add_verbs(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    """Add the verbs of this module through the CLI's `command(name, handler, help)`."""
    command("sessions", cmd_sessions, "list the stored sessions")

    resume = command("resume", cmd_resume, "start an agent on a stored session")
    resume.add_argument("agent_id", metavar="AGENT_ID")
    resume.add_argument("session_id", metavar="SESSION_ID")
    resume.add_argument("--provider", default="", help="model provider (default: server's)")
    resume.add_argument("--model", default="", help="model name (default: provider's)")
    resume.add_argument(
        "--tool", action="append", default=[], metavar="NAME", help="built-in tool (repeatable)"
    )

    fork = command("fork", cmd_fork, "copy a session into a new one")
    fork.add_argument("session_id", metavar="SESSION_ID")
    fork.add_argument("--new-session-id", default="", help="the copy's id (default: generated)")
    fork.add_argument(
        "--at", type=int, metavar="SEQ", help="end the copy at this turn_end (default: the last)"
    )

    for name, handler, help_text in (
        ("inject", cmd_inject, "add context for the agent's next model request"),
        ("steer", cmd_steer, "steer the running turn (queued when idle)"),
    ):
        verb = command(name, handler, help_text)
        verb.add_argument("agent_id", metavar="AGENT_ID")
        verb.add_argument("text", metavar="TEXT")

    wait = command("wait", cmd_wait, "wait until the agent is idle")
    wait.add_argument("agent_id", metavar="AGENT_ID")
    wait.add_argument(
        "--for", dest="wait_timeout", type=float, metavar="SECONDS", help="give up after this"
    )

    plugins = command("plugins", cmd_plugins, "list, register or unregister plugins")
    plugins.add_argument(
        "action", nargs="?", default="list", choices=("list", "register", "unregister")
    )
    plugins.add_argument("target", nargs="?", metavar="ADDRESS|NAME")
    plugins.add_argument("--order", type=int, help="override the plugin's order (register)")


def completion_script(parser: argparse.ArgumentParser) -> str:
    """A bash completion script for the verbs and options of `parser`."""
    globals_ = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    valued = [  # global options whose value is the next word, not a verb
        o for a in parser._actions if a.option_strings and a.nargs != 0 for o in a.option_strings
    ]
    verbs: dict[str, list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                verbs[name] = [o for a in sub._actions for o in a.option_strings]
    cases = "\n".join(
        f'        {name}) opts="{" ".join(options)}" ;;' for name, options in verbs.items()
    )
    return f"""# bash completion for agentloop: eval "$(agentloop completion bash)"
_agentloop() {{
    local cur verb opts i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    verb=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            {"|".join(valued)}) ((i++)) ;;
            -*) ;;
            *) verb="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    case "$verb" in
        "") opts="{" ".join(verbs)} {" ".join(globals_)}" ;;
{cases}
        *) opts="" ;;
    esac
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}}
complete -F _agentloop agentloop
"""
