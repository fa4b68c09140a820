"""Match conditions: their rules, the server's predicate, and the Python helper's side."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agentloop.plugin.check_calls import excluded, fitted, sample_call
from agentloop.plugin.conditions import call_matches, invalid_conditions, name_matcher
from agentloop.plugin.sdk import Plugin, allow_prompt
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import agent_pb2
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from server.kernel.errors import InvalidArgument
from server.kernel.limits import Limits
from server.plugins.conditions import Facets, compile_matcher, facet_filter, no_labels
from server.settings.agent_rules import AgentCatalogue

Conditions = hk.MatchConditions


def subscription(seam: hk.Seam.ValueType, **conditions: object) -> hk.Subscription:
    return hk.Subscription(seam=seam, conditions=Conditions(**conditions))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seam", "conditions", "problem"),
    [
        (hk.SEAM_PROMPT_SUBMIT, {"prompt_regex": "("},
         "subscriptions[3] (SEAM_PROMPT_SUBMIT): conditions.prompt_regex: not a valid regular"),
        (hk.SEAM_PROMPT_SUBMIT, {"prompt_regex": "a" * 1025},
         "conditions.prompt_regex: longer than 1024 characters"),
        (hk.SEAM_REQUEST, {"prompt_prefix": "/x"},
         "(SEAM_REQUEST): conditions.prompt_prefix: applies only to SEAM_PROMPT_SUBMIT"),
        (hk.SEAM_PRE_STEP, {"tools": ["bash"]},
         "(SEAM_PRE_STEP): conditions.tools: applies only to the tool seams"),
        (hk.SEAM_TOOLS_PRE_EXECUTE, {"tools": ["bash", ""]},
         "conditions.tools: a pattern is empty"),
        (hk.SEAM_TOOLS_RESULT, {"event_kinds": ["turn_end"]},
         "conditions.event_kinds: applies only to SEAM_SESSION_EVENTS and SEAM_AGENT_EVENTS"),
        (hk.SEAM_AGENT_EVENTS, {"event_kinds": ["turn_end"]},
         "(SEAM_AGENT_EVENTS): conditions.event_kinds: unknown kinds ['turn_end']"),
        (hk.SEAM_TURN_STOP, {"agent_labels": {"": "x"}}, "conditions.agent_labels: a label key"),
    ],
    ids=["regex", "long-regex", "prefix-seam", "tools-seam", "empty-tool", "kinds-seam",
         "unknown-kind", "empty-label"],
)  # fmt: skip
def test_an_invalid_condition_names_the_subscription_and_the_field(
    seam: hk.Seam.ValueType, conditions: dict[str, object], problem: str
) -> None:
    assert problem in invalid_conditions(3, subscription(seam, **conditions))


@pytest.mark.parametrize(
    ("seam", "conditions"),
    [
        (hk.SEAM_PROMPT_SUBMIT, {"prompt_prefix": "/deploy", "prompt_regex": r"\bprod\b"}),
        (hk.SEAM_TOOLS_APPROVAL, {"tools": ["mcp__*", "bash"]}),
        (hk.SEAM_SESSION_EVENTS, {"event_kinds": ["turn_end"]}),
        (hk.SEAM_AGENT_EVENTS, {"event_kinds": ["status", "approval_requested"]}),
        (hk.SEAM_COMPACT, {"agent_labels": {"team": "red"}}),
    ],
)
def test_valid_conditions_pass(seam: hk.Seam.ValueType, conditions: dict[str, object]) -> None:
    assert invalid_conditions(0, subscription(seam, **conditions)) == ""


def test_tool_patterns_are_names_or_whole_name_globs() -> None:
    matches = name_matcher(["bash", "mcp__*", "read_?", "[wx]rite"])
    assert [matches(n) for n in ("bash", "bash2", "mcp__git__log", "read_a", "read_ab")] == [
        True, False, True, True, False,
    ]  # fmt: skip
    assert matches("write") and matches("xrite") and not matches("Write")


@dataclass
class Input:
    """A seam input with the facets conditions read."""

    agent_id: str
    tool: str = ""
    kind: str = ""
    prompt: str = ""


FACETS = Facets[Input](
    tool=lambda i: i.tool, event_kind=lambda i: i.kind, prompt=lambda i: i.prompt
)


def test_the_servers_predicate_holds_when_every_condition_does() -> None:
    labels = {"red-1": {"team": "red", "tier": "prod"}, "blue-1": {"team": "blue"}}
    sub = subscription(
        hk.SEAM_PROMPT_SUBMIT, agent_labels={"team": "red"}, prompt_prefix="/go",
        prompt_regex="prod|staging",
    )  # fmt: skip
    matches = compile_matcher(sub, FACETS, lambda agent: labels.get(agent, {}))
    assert matches is not None
    assert matches(Input("red-1", prompt="/go prod"))
    assert not matches(Input("red-1", prompt="/go dev"))  # the regex
    assert not matches(Input("red-1", prompt="go prod"))  # the prefix
    assert not matches(Input("blue-1", prompt="/go prod"))  # the labels
    assert not matches(Input("gone", prompt="/go prod"))  # no live agent: no labels


def test_agent_ids_and_both_event_kind_lists_are_conditions_too() -> None:
    sub = hk.Subscription(
        seam=hk.SEAM_SESSION_EVENTS, agent_ids=["a"], event_kinds=["turn_end", "turn_start"],
        conditions=Conditions(event_kinds=["turn_end", "tool_result"]),
    )  # fmt: skip
    matches = compile_matcher(sub, FACETS, lambda agent: {})
    assert matches is not None
    assert matches(Input("a", kind="turn_end"))
    assert not matches(Input("a", kind="turn_start")) and not matches(
        Input("a", kind="tool_result")
    )
    assert not matches(Input("b", kind="turn_end"))


def test_tool_and_event_kind_conditions_filter_the_facet_routed_ahead() -> None:
    """The part of the conditions the seam registry asks before building an input."""
    tools = facet_filter(subscription(hk.SEAM_TOOLS_PRE_EXECUTE, tools=["mcp__*", "bash"]), FACETS)
    assert tools is not None
    assert tools("bash") and tools("mcp__fs__read") and not tools("grep")
    kinds = facet_filter(
        hk.Subscription(
            seam=hk.SEAM_SESSION_EVENTS, event_kinds=["turn_end", "turn_start"],
            conditions=Conditions(event_kinds=["turn_end", "tool_result"]),
        ),
        Facets(event_kind=FACETS.event_kind),
    )  # fmt: skip
    assert kinds is not None and kinds("turn_end") and not kinds("turn_start")
    labels_only = subscription(hk.SEAM_TOOLS_PRE_EXECUTE, agent_labels={"team": "red"})
    assert facet_filter(labels_only, FACETS) is None  # agent conditions are routed apart
    assert facet_filter(hk.Subscription(seam=hk.SEAM_PRE_STEP), Facets()) is None


def test_a_subscription_without_conditions_has_no_predicate_to_run() -> None:
    assert compile_matcher(hk.Subscription(seam=hk.SEAM_PRE_STEP), FACETS, no_labels) is None


def test_the_python_helper_declares_conditions_and_requires_the_capability() -> None:
    plugin = Plugin("p")

    @plugin.tools_pre_execute(tools=["word_*"], agent_labels={"team": "red"})
    async def words(call: hk.HookCall) -> None:
        return None

    @plugin.on_session_event(event_kinds=["turn_end"])
    async def ends(call: hk.HookCall) -> None:
        return None

    @plugin.on_agent_event(event_kinds=["status"])
    async def statuses(call: hk.HookCall) -> None:
        return None

    described = plugin.describe()
    by_seam = {s.seam: s for s in described.subscriptions}
    tools = by_seam[hk.SEAM_TOOLS_PRE_EXECUTE].conditions
    assert list(tools.tools) == ["word_*"] and dict(tools.agent_labels) == {"team": "red"}
    # Session event kinds stay in the older field every server reads.
    assert list(by_seam[hk.SEAM_SESSION_EVENTS].event_kinds) == ["turn_end"]
    assert not by_seam[hk.SEAM_SESSION_EVENTS].HasField("conditions")
    assert list(by_seam[hk.SEAM_AGENT_EVENTS].conditions.event_kinds) == ["status"]
    assert list(described.capabilities) == ["match_conditions"]
    assert list(Plugin("plain").describe().capabilities) == []


async def test_the_python_helper_never_runs_a_handler_outside_its_conditions() -> None:
    plugin = Plugin("p")
    seen: list[str] = []

    @plugin.prompt_submit(prompt_prefix="/deploy")
    async def deploy(call: hk.HookCall) -> d.PromptDecision:
        seen.append(call.call_id)
        return allow_prompt("rewritten")

    def prompt(call_id: str, text: str) -> hk.HookCall:
        content = [c.ContentBlock(text=c.TextBlock(text=text))]
        return hk.HookCall(
            call_id=call_id, kind=hk.CALL_KIND_SEAM, seam=hk.SEAM_PROMPT_SUBMIT,
            prompt_submit=hk.PromptSubmitCall(content=content),
        )  # fmt: skip

    outside = await plugin.handle(prompt("c1", "hello"))
    inside = await plugin.handle(prompt("c2", "/deploy prod"))

    assert outside == hk.HookResult(call_id="c1")  # "continue unchanged"
    assert inside is not None and inside.HasField("prompt_submit")
    assert seen == ["c2"]


def test_the_checker_fits_a_sample_to_the_conditions_and_makes_one_they_exclude() -> None:
    sub = subscription(hk.SEAM_TOOLS_PRE_EXECUTE, tools=["deploy_[ps]*"])
    sub.agent_ids.append("ops")
    sample = sample_call("k0", "tool_pre_execute")

    fit, out = fitted(sample, sub), excluded(sample, sub)

    assert fit is not None and call_matches(sub, fit)
    assert fit.agent_id == "ops" and fit.tool_pre_execute.invocation.name == "deploy_px"
    assert out is not None and not call_matches(sub, out)


@pytest.mark.parametrize(
    ("labels", "problem"),
    [
        ({"team": "x" * 257}, "the value of 'team' is longer than 256 characters"),
        ({"bad key": "v"}, "key 'bad key' must be 1-63 letters"),
        ({f"k{i}": "v" for i in range(33)}, "33 labels (at most 32)"),
    ],
)
def test_agent_labels_are_checked_at_creation(labels: dict[str, str], problem: str) -> None:
    catalogue = AgentCatalogue(["scripted"], [], "scripted", Limits())
    options = agent_pb2.AgentOptions(labels=labels)

    with pytest.raises(InvalidArgument) as refused:
        catalogue.check(options, "")

    assert refused.value.field == "options.labels"
    assert problem in refused.value.problem
