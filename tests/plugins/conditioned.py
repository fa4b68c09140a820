r"""A test plugin whose subscriptions carry match conditions (used by tests/e2e).

    python tests/plugins/conditioned.py --listen 127.0.0.1:0 --name p --record PATH

prints `plugin NAME listening on HOST:PORT` once serving. Every subscription is limited
to agents labelled `plugin=NAME`; each handled call appends `PAYLOAD AGENT DETAIL` to
PATH:
- `prompt_submit`, for prompts starting with "/deploy" that mention prod or staging:
  rewrites the text to `TEXT-NAME`;
- `tools_pre_execute`, for the tools `word_*`: allows (detail: the tool);
- `on_agent_event`, for `status` events only (detail: the event kind);
- `turn_stop`, for agents also labelled `team=red`.

`--bad regex|seam|kind` adds a condition the server refuses: a prompt regex that does
not compile, a tool condition on `turn_continuation`, an unknown agent event kind.
`--ignore-conditions` runs the handlers for calls outside the conditions too (the
helper otherwise answers those "continue unchanged" itself): a plugin whose decisions
do not follow what it declared, which the conformance checker reports.
"""

from __future__ import annotations

import argparse

from agentloop.plugin.sdk import Plugin, allow_prompt, text_of
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import decision_pb2


def build(name: str, record: str, bad: str) -> Plugin:
    """The plugin, recording each call it handles to the file `record`."""
    plugin = Plugin(name, version="test")
    mine = {"plugin": name}

    def note(call: hs.HookCall, detail: str) -> None:
        with open(record, "a") as file:  # small and local: blocking is fine here
            file.write(f"{call.WhichOneof('payload')} {call.agent_id} {detail}\n")

    regex = "(" if bad == "regex" else "prod|staging"

    @plugin.prompt_submit(agent_labels=mine, prompt_prefix="/deploy", prompt_regex=regex)
    async def deploy(call: hs.HookCall) -> decision_pb2.PromptDecision:
        text = text_of(call.prompt_submit.content)
        note(call, text.replace(" ", "_"))
        return allow_prompt(f"{text}-{name}")

    @plugin.tools_pre_execute(agent_labels=mine, tools=["word_*"])
    async def words(call: hs.HookCall) -> None:
        note(call, call.tool_pre_execute.invocation.name)

    kinds = ["no_such_kind"] if bad == "kind" else ["status"]

    @plugin.on_agent_event(agent_labels=mine, event_kinds=kinds)
    async def status(call: hs.HookCall) -> None:
        note(call, call.agent_event.event.WhichOneof("event") or "")

    @plugin.turn_stop(agent_labels={**mine, "team": "red"})
    async def stop(call: hs.HookCall) -> None:
        note(call, "-")

    if bad == "seam":

        @plugin.turn_continuation(tools=["word_count"])
        async def misplaced(call: hs.HookCall) -> None:
            note(call, "-")

    return plugin


def ignoring_conditions(plugin: Plugin) -> Plugin:
    """The plugin with the helper's own check of its conditions turned off."""
    for subscription in plugin.registry.subscriptions.values():
        subscription.matches = None
    return plugin


def main() -> None:
    """Parse the command line and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--name", default="conditioned")
    parser.add_argument("--record", default="/dev/null")
    parser.add_argument("--bad", choices=["regex", "seam", "kind"], default="")
    parser.add_argument("--ignore-conditions", action="store_true")
    args = parser.parse_args()
    plugin = build(args.name, args.record, args.bad)
    if args.ignore_conditions:
        ignoring_conditions(plugin)
    plugin.run(args.listen)


if __name__ == "__main__":
    main()
