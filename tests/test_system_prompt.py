"""Tests of system prompt assembly, rendering and strict variables."""

from __future__ import annotations

from typing import cast

import pytest

from server.kernel.errors import CodedError
from server.kernel.prompt import Assembly, Section
from server.kernel.seams import SYSTEM_PROMPT_ASSEMBLE, SeamRegistry
from server.loop.system_prompt import (
    IDENTITY_TEXT,
    PromptScope,
    SystemPrompt,
    default_system_prompt,
    interpolate,
    persona_section,
    render,
)


def one(text: str, **variables: str | None) -> str:
    return render(Assembly([Section("s", 0, text)], dict(variables)))


def render_error(text: str, **variables: str | None) -> CodedError:
    with pytest.raises(CodedError) as info:
        one(text, **variables)
    assert info.value.code == "PROMPT_VARIABLE"
    return info.value


# Strict variables.


def test_substitutes_known_variables():
    assert one("model {{model}} at {{cwd}}.", model="m1", cwd="/w") == "model m1 at /w."


def test_names_allow_digits_and_underscores_after_a_letter():
    assert one("{{a1_b}}", a1_b="x") == "x"


def test_unknown_variable_is_an_error():
    err = render_error("hi {{nope}}", model="m")
    assert str(err) == 'unknown prompt variable "nope"'


def test_variable_without_value_is_an_error():
    err = render_error("in {{cwd}}", cwd=None)
    assert str(err) == 'prompt variable "cwd" has no value for this assembly'


@pytest.mark.parametrize(
    "template",
    ["{{Model}}", "{{ model }}", "{{}}", "{{1abc}}", "{{a-b}}", "{{a {{model}}", "{{{model}}}"],
)
def test_malformed_group_with_a_later_close_is_an_error(template: str):
    err = render_error(template, model="m")
    assert "malformed" in str(err)


def test_malformed_group_spanning_lines_is_an_error():
    render_error("{{mo\ndel}}", model="m")


@pytest.mark.parametrize("template", ["a {{ b", "{{", "x {{model", "}} {{"])
def test_lone_open_without_a_later_close_is_literal(template: str):
    assert one(template, model="m") == template


def test_lone_open_after_a_complete_reference_is_literal():
    assert one("{{model}} then {{ never closed", model="m") == "m then {{ never closed"


def test_lone_close_is_literal():
    assert one("a }} b", model="m") == "a }} b"


def test_substituted_values_are_not_rescanned():
    assert one("{{a}}", a="{{b}}") == "{{b}}"
    assert one("{{a}}", a="{{") == "{{"


def test_empty_value_substitutes_empty():
    assert one("[{{a}}]", a="") == "[]"


def test_interpolate_without_references_returns_the_text():
    text = "plain"
    assert interpolate(text, {}) is text


def test_add_variable_rejects_a_name_that_cannot_be_referenced():
    with pytest.raises(ValueError):
        SystemPrompt().add_variable("Bad-name", lambda _s: "x")


# Rendering.


def test_render_sorts_by_order_stably_and_joins_with_a_blank_line():
    sections = [
        Section("c", 10, "C"),
        Section("a", 0, "A1"),
        Section("z", -5, "Z"),
        Section("b", 0, "A2"),
    ]
    assert render(Assembly(sections, {})) == "Z\n\nA1\n\nA2\n\nC"


def test_render_drops_empty_results():
    sections = [Section("a", 0, ""), Section("b", 1, "B"), Section("c", 2, "{{e}}")]
    assert render(Assembly(sections, {"e": ""})) == "B"


def test_render_is_empty_when_every_section_is_empty():
    assert render(Assembly([Section("a", 0, ""), Section("b", 1, "{{e}}")], {"e": ""})) == ""
    assert render(Assembly()) == ""


def test_render_error_names_the_variable_even_in_a_later_section():
    assembly = Assembly([Section("a", 0, "fine"), Section("b", 1, "{{cwd}}")], {"cwd": None})
    with pytest.raises(CodedError, match="no value for this assembly"):
        render(assembly)


# Registration, shadowing and assembly.


async def test_default_prompt_renders_identity_then_persona_then_guidance():
    prompt = default_system_prompt()
    prompt.add_section(persona_section("You run {{model}} from {{provider}}."), agent_id="a1")
    prompt.add_section(Section("tools", 100, "Use tools wisely."))
    scope = PromptScope(agent_id="a1", provider="scripted", model="m1", cwd="/w")
    assembly = await prompt.assemble(scope, SeamRegistry())
    assert assembly.variables == {"provider": "scripted", "model": "m1", "cwd": "/w"}
    assert prompt.render(assembly) == (
        f"{IDENTITY_TEXT}\n\nYou run m1 from scripted.\n\nUse tools wisely."
    )


async def test_cwd_resolves_from_the_scope():
    prompt = default_system_prompt()
    prompt.add_section(persona_section("Work in {{cwd}}."), agent_id="a1")
    assembly = await prompt.assemble(PromptScope("a1", cwd="/srv/app"), SeamRegistry())
    assert render(assembly).endswith("Work in /srv/app.")


async def test_empty_scope_fields_have_no_value():
    prompt = default_system_prompt()
    prompt.add_section(persona_section("Work in {{cwd}}."), agent_id="a1")
    assembly = await prompt.assemble(PromptScope("a1", provider="p", model="m"), SeamRegistry())
    assert assembly.variables == {"provider": "p", "model": "m", "cwd": None}
    with pytest.raises(CodedError, match='prompt variable "cwd" has no value for this assembly'):
        render(assembly)


def test_persona_section_is_named_persona_at_order_zero():
    assert persona_section("hi") == Section("persona", 0, "hi")


async def test_scoped_section_shadows_the_global_one_for_its_agent_only():
    prompt = SystemPrompt()
    prompt.add_section(Section("persona", 0, "global"))
    prompt.add_section(Section("persona", 0, "mine"), agent_id="a1")
    seams = SeamRegistry()
    assert render(await prompt.assemble(PromptScope("a1"), seams)) == "mine"
    assert render(await prompt.assemble(PromptScope("a2"), seams)) == "global"


async def test_scoped_shadow_wins_even_when_registered_first():
    prompt = SystemPrompt()
    prompt.add_section(Section("persona", 0, "mine"), agent_id="a1")
    prompt.add_section(Section("persona", 0, "global"))
    assert prompt.sections_for("a1") == [Section("persona", 0, "mine")]


async def test_disposers_remove_their_registration():
    prompt = SystemPrompt()
    prompt.add_section(Section("persona", 0, "global"))
    dispose = prompt.add_section(Section("persona", 0, "mine"), agent_id="a1")
    dispose_extra = prompt.add_section(Section("extra", 5, "extra"))
    dispose()
    dispose()  # idempotent
    dispose_extra()
    assert render(await prompt.assemble(PromptScope("a1"), SeamRegistry())) == "global"


async def test_scoped_variable_shadows_global_and_disposes():
    prompt = SystemPrompt()
    prompt.add_section(Section("s", 0, "{{who}}"))
    prompt.add_variable("who", lambda _s: "everyone")
    dispose = prompt.add_variable("who", lambda s: s.agent_id, agent_id="a1")
    seams = SeamRegistry()
    assert render(await prompt.assemble(PromptScope("a1"), seams)) == "a1"
    assert render(await prompt.assemble(PromptScope("a2"), seams)) == "everyone"
    dispose()
    assert render(await prompt.assemble(PromptScope("a1"), seams)) == "everyone"


async def test_remove_agent_drops_scoped_registrations_and_disposers_still_work():
    prompt = SystemPrompt()
    dispose_global = prompt.add_section(Section("g", 0, "G"))
    prompt.add_section(Section("p", 1, "P"), agent_id="a1")
    prompt.add_variable("v", lambda _s: "x", agent_id="a1")
    prompt.remove_agent("a1")
    assembly = await prompt.assemble(PromptScope("a1"), SeamRegistry())
    assert assembly.sections == [Section("g", 0, "G")]
    assert assembly.variables == {}
    dispose_global()
    assert prompt.sections_for("a1") == []


async def test_sections_keep_registration_order_for_equal_orders():
    prompt = SystemPrompt()
    prompt.add_section(Section("b", 0, "first"))
    prompt.add_section(Section("a", 0, "second"))
    assert render(await prompt.assemble(PromptScope("x"), SeamRegistry())) == "first\n\nsecond"


async def test_resolvers_receive_the_scope():
    seen: list[PromptScope] = []
    prompt = SystemPrompt()

    def resolve(scope: PromptScope) -> str:
        seen.append(scope)
        return "v"

    prompt.add_variable("v", resolve)
    scope = PromptScope("a1", "p", "m", "/c")
    await prompt.assemble(scope, SeamRegistry())
    assert seen == [scope]


# The assemble waterfall.


async def test_waterfall_listener_can_supply_a_variable():
    prompt = default_system_prompt()
    prompt.add_section(persona_section("Model {{model}}."), agent_id="a1")
    seams = SeamRegistry()

    async def supply_model(assembly: Assembly, next_):
        assembly.variables["model"] = "from-listener"
        return await next_()

    seams.on(SYSTEM_PROMPT_ASSEMBLE, supply_model)
    assembly = await prompt.assemble(PromptScope("a1", provider="p"), seams)
    assert render(assembly).endswith("Model from-listener.")


async def test_waterfall_result_is_authoritative():
    prompt = default_system_prompt()
    seams = SeamRegistry()
    seams.on(SYSTEM_PROMPT_ASSEMBLE, lambda assembly, next_: Assembly([], {}))
    assembly = await prompt.assemble(PromptScope("a1"), seams)
    assert assembly.sections == []
    assert render(assembly) == ""


async def test_waterfall_listener_emptying_sections_renders_empty():
    prompt = default_system_prompt()
    prompt.add_section(persona_section("persona"), agent_id="a1")
    seams = SeamRegistry()

    async def empty(assembly: Assembly, next_):
        result = await next_()
        result.sections.clear()
        return result

    seams.on(SYSTEM_PROMPT_ASSEMBLE, empty)
    assert render(await prompt.assemble(PromptScope("a1"), seams)) == ""


async def test_waterfall_is_dispatched_for_the_scope_agent():
    prompt = SystemPrompt()
    prompt.add_section(Section("s", 0, "kept"))
    seams = SeamRegistry()
    seams.on(SYSTEM_PROMPT_ASSEMBLE, lambda assembly, next_: Assembly(), agent_id="a1")
    assert render(await prompt.assemble(PromptScope("a1"), seams)) == ""
    assert render(await prompt.assemble(PromptScope("a2"), seams)) == "kept"


async def test_waterfall_returning_a_non_assembly_is_an_error():
    seams = SeamRegistry()
    # Ill-typed on purpose: the assembly checks what a listener really returned.
    seams.on(SYSTEM_PROMPT_ASSEMBLE, lambda assembly, next_: cast(Assembly, None))
    with pytest.raises(CodedError, match="not an Assembly"):
        await default_system_prompt().assemble(PromptScope("a1"), seams)


# Hostile templates: one linear pass (a lazy regex rescanned the tail per `{{`).

MEGABYTE = 1_000_000


def test_a_megabyte_of_open_braces_is_literal() -> None:
    template = "{{" * (MEGABYTE // 2)
    assert interpolate(template, {"x": "1"}) == template


def test_a_megabyte_of_open_braces_then_a_close_is_one_malformed_group() -> None:
    with pytest.raises(CodedError) as info:
        interpolate("{{" * (MEGABYTE // 2) + "}}", {})
    message = str(info.value)
    assert message.startswith('malformed prompt variable reference "{{{{{{')
    assert len(message) < 120  # the group is shown shortened


def test_a_megabyte_of_references_is_substituted() -> None:
    template = "{{x}}-" * (MEGABYTE // 6)
    assert interpolate(template, {"x": "ab"}) == "ab-" * (MEGABYTE // 6)


def test_interleaved_braces_follow_the_first_close_rule() -> None:
    assert interpolate("{{x}}}", {"x": "v"}) == "v}"
    with pytest.raises(CodedError, match='malformed prompt variable reference "{{ b {{x}}"'):
        interpolate("a {{ b {{x}}", {"x": "v"})
    assert interpolate("}} {{x}} {{", {"x": "v"}) == "}} v {{"


async def test_a_scope_only_prompt_is_rendered_once_per_scope_until_a_registration():
    prompt = SystemPrompt()
    prompt.add_section(Section("s", 0, "{{who}} on {{place}}"))
    resolved: list[str] = []

    def who(scope: PromptScope) -> str:
        resolved.append(scope.agent_id)
        return scope.agent_id

    prompt.add_variable("who", who, scope_only=True)
    prompt.add_variable("place", lambda s: s.cwd or None, scope_only=True)
    seams = SeamRegistry()
    here, there = PromptScope("a1", cwd="/here"), PromptScope("a1", cwd="/there")
    assert await prompt.system_text(here, seams) == "a1 on /here"
    assert await prompt.system_text(here, seams) == "a1 on /here"
    assert resolved == ["a1"]  # the second step reused the first's text
    assert await prompt.system_text(there, seams) == "a1 on /there"  # another scope
    assert resolved == ["a1", "a1"]
    dispose = prompt.add_section(Section("t", 1, "late"))
    assert await prompt.system_text(here, seams) == "a1 on /here\n\nlate"
    dispose()
    assert await prompt.system_text(here, seams) == "a1 on /here"
    assert resolved == ["a1"] * 4  # each registration change rendered it again


async def test_a_prompt_with_any_other_variable_or_an_assemble_listener_is_assembled_each_time():
    prompt = default_system_prompt()
    ticks = iter(range(100))
    prompt.add_section(Section("clock", 5, "tick {{tick}}"))
    prompt.add_variable("tick", lambda _s: str(next(ticks)))  # not scope-only: a clock
    seams = SeamRegistry()
    scope = PromptScope("a1", provider="p", model="m")
    assert (await prompt.system_text(scope, seams)).endswith("tick 0")
    assert (await prompt.system_text(scope, seams)).endswith("tick 1")

    calls: list[str] = []

    async def listener(assembly: Assembly, next_: object) -> Assembly:
        calls.append("assemble")
        return Assembly([Section("x", 0, f"call {len(calls)}")], {})

    plain = default_system_prompt()
    seams.on(SYSTEM_PROMPT_ASSEMBLE, listener)
    assert await plain.system_text(scope, seams) == "call 1"
    assert await plain.system_text(scope, seams) == "call 2"
