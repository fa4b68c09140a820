"""The CLI's verbs beyond talking to one agent, and the `--json` output of every verb.

The verbs: sessions (list, delete), resume, fork, inject, steer, wait, plugins, shell completion.

With `--json`, a verb prints its response as one JSON object (field names as in the
proto), and a streaming verb prints one object per event, one per line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from agentloop.cli import render
from agentloop.client import Client
from agentloop.plugin.v1 import plugin_registry_service_pb2 as reg
from agentloop.v1 import agent_pb2

Command = Callable[[Client, argparse.Namespace], Awaitable[int]]


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


async def cmd_sessions(client: Client, args: argparse.Namespace) -> int:
    """`sessions [list|delete SESSION_ID]`: every stored session, or delete one."""
    if args.action == "delete":
        return await cmd_delete_session(client, args)
    sessions = await client.list_sessions()
    width = max([len("SESSION"), *(len(s.session_id) for s in sessions)])
    rows = [f"{'SESSION':<{width}}  EVENTS"]
    rows += [f"{s.session_id:<{width}}  {s.event_count}" for s in sessions]
    emit(args, {"sessions": [as_dict(s) for s in sessions]}, "\n".join(rows) + "\n")
    return 0


async def cmd_delete_session(client: Client, args: argparse.Namespace) -> int:
    """`sessions delete SESSION_ID [--dispose] [--request-id ID]`."""
    response = await client.delete_session(
        args.session_id, dispose_agent=args.dispose, request_id=args.request_id
    )
    text = f"deleted {response.session_id} ({response.deleted_events} events)"
    if response.disposed_agent_id:
        text += f", disposed agent {response.disposed_agent_id}"
    emit(args, response, text + "\n")
    return 0


async def cmd_resume(client: Client, args: argparse.Namespace) -> int:
    """`resume`: a new agent driving a stored session."""
    options = agent_pb2.AgentOptions(provider=args.provider, model=args.model, tools=args.tool)
    agent = await client.resume(args.agent_id, args.session_id, options)
    text = f"agent    {agent.agent_id}\nsession  {agent.session_id}\n"
    emit(args, agent, text + f"status   {render.status_word(agent.status)}\n")
    return 0


async def cmd_fork(client: Client, args: argparse.Namespace) -> int:
    """`fork`: copy a session (up to a sequence number) into a new one."""
    session = await client.fork(args.session_id, args.at, args.new_session_id)
    emit(args, session, f"forked into {session.session_id}\n")
    return 0


async def cmd_inject(client: Client, args: argparse.Namespace) -> int:
    """`inject`: add context to an agent's session (it reaches the next model request)."""
    response = await client.inject(args.agent_id, args.text)
    emit(args, response, f"injected (next seq {response.next_seq})\n")
    return 0


async def cmd_steer(client: Client, args: argparse.Namespace) -> int:
    """`steer`: steer the running turn, or queue a message when the agent is idle."""
    response = await client.steer(args.agent_id, args.text)
    what = "steering the running turn" if response.steering else "queued as a new message"
    emit(args, response, f"{what} (next seq {response.next_seq})\n")
    return 0


async def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    """`wait`: block until the agent is idle (exit 1 when the wait timed out)."""
    response = await client.wait_idle(args.agent_id, args.wait_timeout)
    word = render.status_word(response.status)
    emit(args, response, ("idle" if response.idle else f"not idle ({word})") + "\n")
    return 0 if response.idle else 1


async def cmd_plugins(client: Client, args: argparse.Namespace) -> int:
    """`plugins [list|register ADDRESS|unregister NAME]`."""
    if args.action == "register":
        plugin = await client.register_plugin(args.target, order=args.order)
        emit(args, plugin, f"registered {plugin.name} {plugin.version} at {plugin.address}\n")
        return 0
    if args.action == "unregister":
        response = await client.unregister_plugin(args.target)
        emit(args, response, f"unregistered {args.target}\n")
        return 0
    plugins = await client.plugins()
    rows = [f"{'PLUGIN':<24} {'STATE':<12} {'CALLS':>7} ADDRESS"]
    for plugin in plugins:
        state = render.word_of(reg.PluginState.Name, plugin.state, "PLUGIN_STATE_")
        rows.append(f"{plugin.name:<24} {state:<12} {plugin.stats.calls:>7} {plugin.address}")
    emit(args, reg.ListPluginsResponse(plugins=plugins), "\n".join(rows) + "\n")
    return 0


def add_verbs(command: Callable[[str, Any, str], argparse.ArgumentParser]) -> None:
    """Add the verbs of this module through the CLI's `command(name, handler, help)`."""
    sessions = command("sessions", cmd_sessions, "list the stored sessions, or delete one")
    sessions.add_argument("action", nargs="?", default="list", choices=("list", "delete"))
    sessions.add_argument("session_id", nargs="?", default="", metavar="SESSION_ID")
    sessions.add_argument(
        "--dispose", action="store_true", help="delete: dispose the agent driving it first"
    )
    sessions.add_argument("--request-id", default="", help="delete: retry-safe request id")

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
