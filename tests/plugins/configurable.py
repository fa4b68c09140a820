r"""A test plugin whose behaviour is chosen on the command line (used by tests/e2e).

    python tests/plugins/configurable.py --listen 127.0.0.1:0 --name p1 --tag A --order 1

prints `plugin NAME listening on HOST:PORT` once serving, then serves until SIGTERM.

`agent/prompt-submit` (subscribed when any of --tag, --context, --block, --slow,
--hang or --malformed is given):
- `--block REASON`: block every prompt;
- `--slow SECONDS`: sleep first; when the call is cancelled, print
  `cancelled CALL_ID` (flushed) to stdout and, with `--cancel-file`, append it there;
- `--hang`: never answer (the server's deadline decides);
- `--malformed`: answer with a `tool_pre_execute` decision (another seam's kind);
- `--tag TAG`: rewrite the prompt's text to `TEXT-TAG`;
- `--context TEXT`: add a context (source kind "plugin", name = the plugin's name).

Other seams:
- `--continue-once`: `agent/turn-continuation` forces one more step per turn (then
  leaves the decision unchanged);
- `--deny-tool NAME` (with `--deny-reason`): `tools/pre-execute` denies that tool;
- `--ask-tool NAME` (with `--ask-reason`): `tools/pre-execute` asks approval for it;
- `--tool NAME` (with `--tool-sleep SECONDS`, `--tool-agents A,B`): a parallel-safe
  tool that sleeps, then returns `NAME done`, offered only to those agents if given.

A fault on a tool seam (`--fault-seam pre-execute|post-execute|tool`, the tool being
`--tool NAME`) with `--fault hang|error|malformed|die`: never answer, answer an error
naming an address (`connect to 10.9.8.7:6 failed`), answer another seam's decision, or
exit the process at the call.

`--observe-file PATH` (with `--buffer N`): a session-event observer (buffer N) that
appends `KIND DROPPED` per notification to PATH.

Every subscription takes `--order`, `--timeout` and `--fail-open`; `--token` requires
that bearer token from the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from agentloop.plugin.sdk import (
    FAIL_CLOSED,
    FAIL_OPEN,
    Options,
    Plugin,
    allow_prompt,
    ask,
    block_prompt,
    context,
    continue_turn,
    deny,
    text_of,
)
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import content_pb2, decision_pb2


def record(note: str, path: str) -> None:
    """Append `note` to the file `path` (when set), then print it (flushed).

    The file first: a reader of the stdout line then finds the file written.
    """
    if path:
        with open(path, "a") as file:
            file.write(note + "\n")
    print(note, flush=True)


def append(path: str, line: str) -> None:
    """Append one line to the file `path` (small, local: blocking is fine here)."""
    with open(path, "a") as file:
        file.write(line + "\n")


def build(args: argparse.Namespace) -> Plugin:
    """The plugin the arguments describe."""
    plugin = Plugin(args.name, version="test", token=args.token or None)
    options: Options = {
        "order": args.order,
        "failure_policy": FAIL_OPEN if args.fail_open else FAIL_CLOSED,
    }
    if args.timeout is not None:
        options["timeout"] = args.timeout
    source = content_pb2.Source(kind="plugin", name=args.name)

    if args.tag or args.context or args.block or args.slow or args.hang or args.malformed:

        @plugin.prompt_submit(**options)
        async def prompt(call: hs.HookCall) -> decision_pb2.PromptDecision | None:
            if args.hang:
                await asyncio.Event().wait()
            if args.slow:
                try:
                    await asyncio.sleep(args.slow)
                except asyncio.CancelledError:
                    record(f"cancelled {call.call_id}", args.cancel_file)
                    raise
            if args.block:
                return block_prompt(args.block)
            text = text_of(call.prompt_submit.content)
            rewritten = f"{text}-{args.tag}" if args.tag else None
            contexts = [context(args.context, source)] if args.context else []
            if rewritten is None and not contexts:
                return None
            return allow_prompt(rewritten, contexts)

    if args.continue_once:
        continued: set[tuple[str, int]] = set()

        @plugin.turn_continuation(**options)
        async def again(call: hs.HookCall) -> decision_pb2.ContinuationDecision | None:
            key = (call.agent_id, call.turn)
            if key in continued:
                return None
            continued.add(key)
            return continue_turn()

    if args.deny_tool or args.ask_tool:

        @plugin.tools_pre_execute(**options)
        async def guard(call: hs.HookCall) -> decision_pb2.PreToolDecision | None:
            if call.tool_pre_execute.invocation.name == args.deny_tool:
                return deny(args.deny_reason)
            if call.tool_pre_execute.invocation.name == args.ask_tool:
                return ask(args.ask_reason)
            return None

    if args.fault:
        fault_at(plugin, args, options)

    if args.observe_file:

        @plugin.on_session_event(buffer_size=args.buffer)
        async def observe(call: hs.HookCall) -> None:
            notice = call.session_event
            append(args.observe_file, f"{notice.event.WhichOneof('payload')} {notice.dropped}")

    if args.tool and args.fault_seam != "tool":
        agent_ids = [a for a in args.tool_agents.split(",") if a]

        @plugin.tool(
            args.tool, description="Sleeps, then answers.", parallel_safe=True, agent_ids=agent_ids
        )
        async def slow_tool(arguments: Any, call: hs.HookCall) -> str:
            await asyncio.sleep(args.tool_sleep)
            return f"{args.tool} done"

    if args.malformed:
        run = plugin.registry.answer

        async def malformed(call: hs.HookCall) -> hs.HookResult | None:
            if call.WhichOneof("payload") != "prompt_submit":
                return await run(call)
            return hs.HookResult(
                call_id=call.call_id,
                tool_pre_execute=decision_pb2.PreToolDecision(allow=decision_pb2.ToolAllow()),
            )

        plugin.registry.answer = malformed  # type: ignore[method-assign]

    return plugin


async def fault(args: argparse.Namespace) -> None:
    """Misbehave as `--fault` says (the malformed answer is made in `fault_at`)."""
    if args.fault == "hang":
        await asyncio.Event().wait()
    if args.fault == "die":
        os._exit(3)
    if args.fault == "error":
        raise RuntimeError("connect to 10.9.8.7:6 failed")


def fault_at(plugin: Plugin, args: argparse.Namespace, options: Options) -> None:
    """Subscribe the faulty handler at `--fault-seam`."""
    if args.fault_seam == "pre-execute":

        @plugin.tools_pre_execute(**options)
        async def pre(call: hs.HookCall) -> None:
            await fault(args)

    elif args.fault_seam == "post-execute":

        @plugin.tools_post_execute(**options)
        async def post(call: hs.HookCall) -> None:
            await fault(args)

    else:

        @plugin.tool(args.tool, description="Misbehaves.", parallel_safe=True)
        async def faulty_tool(arguments: Any, call: hs.HookCall) -> str:
            await fault(args)
            return "unreachable"

    if args.fault == "malformed":
        run = plugin.registry.answer

        async def malformed(call: hs.HookCall) -> hs.HookResult | None:
            if call.WhichOneof("payload") not in ("tool_pre_execute", "tool_post_execute",
                                                  "tool_execute"):  # fmt: skip
                return await run(call)
            return hs.HookResult(
                call_id=call.call_id,
                prompt_submit=decision_pb2.PromptDecision(allow=decision_pb2.PromptAllow()),
            )

        plugin.registry.answer = malformed  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--name", default="configurable")
    parser.add_argument("--token", default="")
    parser.add_argument("--order", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--fail-open", action="store_true")
    parser.add_argument("--tag", default="")
    parser.add_argument("--context", default="")
    parser.add_argument("--block", default="")
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--cancel-file", default="")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--malformed", action="store_true")
    parser.add_argument("--continue-once", action="store_true")
    parser.add_argument("--deny-tool", default="")
    parser.add_argument("--deny-reason", default="denied by the test plugin")
    parser.add_argument("--ask-tool", default="")
    parser.add_argument("--ask-reason", default="")
    parser.add_argument("--tool", default="")
    parser.add_argument("--tool-sleep", type=float, default=0.3)
    parser.add_argument("--observe-file", default="")
    parser.add_argument("--buffer", type=int, default=0)
    parser.add_argument("--tool-agents", default="", help="comma-separated agent filter")
    parser.add_argument("--fault", choices=["hang", "error", "malformed", "die"], default="")
    parser.add_argument(
        "--fault-seam", choices=["pre-execute", "post-execute", "tool"], default="pre-execute"
    )
    args = parser.parse_args(argv)
    build(args).run(args.listen)


if __name__ == "__main__":
    main()
