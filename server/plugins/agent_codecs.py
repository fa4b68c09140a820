"""The codecs of the agent seams: each typed input as its call, each decision applied.

Per seam, field by field and checked by mypy: `fill` writes the seam's input into its
`HookCall` payload message, `read` takes the decision from its `HookResult` outcome
field, and the apply function says what the decision does in the chain.
"""

from __future__ import annotations

import dataclasses

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d
from server.kernel import seams as S
from server.kernel.seams import Next
from server.plugins.conditions import Facets, prompt_text
from server.plugins.modes import Check, Codec, Transform, Wrap
from server.plugins.rewrites import compose

# -- agent/prompt-submit: allow (rewrite, add contexts) or block the prompt -------------


def _fill_prompt_submit(input: S.PromptSubmit, call: hk.HookCall) -> None:
    payload = call.prompt_submit
    payload.SetInParent()
    payload.content.extend(input.content)
    payload.source.CopyFrom(input.source)


def _read_prompt_submit(result: hk.HookResult) -> d.PromptDecision:
    return result.prompt_submit


def _allow(decision: d.PromptDecision) -> d.PromptAllow:
    return decision.allow


async def _apply_prompt_submit(
    input: S.PromptSubmit, mine: d.PromptDecision, next_: Next[S.PromptSubmit, d.PromptDecision]
) -> d.PromptDecision:
    async def rest(content: list[c.ContentBlock]) -> d.PromptDecision:
        return await next_(dataclasses.replace(input, content=content))

    return await compose(mine, _allow, input.content, rest)


# -- agent/session-prefix: the plugin replaces the prefix the rest composed -------------


def _fill_session_prefix(prefix: list[c.Message], call: hk.HookCall) -> None:
    call.session_prefix.prefix.extend(prefix)


def _read_session_prefix(result: hk.HookResult) -> hk.SessionPrefixResult:
    return result.session_prefix


def _apply_session_prefix(mine: hk.SessionPrefixResult) -> list[c.Message]:
    return list(mine.prefix)


# -- agent/pre-step: the plugin adds context before the step ----------------------------


def _fill_pre_step(input: S.PreStep, call: hk.HookCall) -> None:
    payload = call.pre_step
    payload.SetInParent()
    payload.system = input.system
    payload.prefix.extend(input.prefix)


def _read_pre_step(result: hk.HookResult) -> hk.PreStepResult:
    return result.pre_step


def _decide_pre_step(input: S.PreStep, mine: hk.PreStepResult) -> None:
    for context in mine.contexts:
        input.agent.inject(context)


# -- agent/request: the plugin replaces the model configuration -------------------------


def _fill_request(input: S.Request, call: hk.HookCall) -> None:
    payload = call.request
    payload.SetInParent()
    payload.config.CopyFrom(input.config)


def _read_request(result: hk.HookResult) -> hk.RequestResult:
    return result.request


async def _apply_request(
    input: S.Request, mine: hk.RequestResult, next_: Next[S.Request, c.ModelConfig]
) -> c.ModelConfig:
    return await next_(dataclasses.replace(input, config=mine.config))


# -- agent/step-result: the plugin replaces the assistant message -----------------------


def _fill_step_result(input: S.StepResult, call: hk.HookCall) -> None:
    payload = call.step_result
    payload.SetInParent()
    payload.message.CopyFrom(input.message)


def _read_step_result(result: hk.HookResult) -> hk.StepResultResult:
    return result.step_result


async def _apply_step_result(
    input: S.StepResult, mine: hk.StepResultResult, next_: Next[S.StepResult, c.Message]
) -> c.Message:
    return await next_(dataclasses.replace(input, message=mine.message))


# -- agent/turn-continuation: stop the turn or run another step -------------------------


def _fill_turn_continuation(input: S.TurnContinuation, call: hk.HookCall) -> None:
    payload = call.turn_continuation
    payload.SetInParent()
    payload.decision.CopyFrom(input.decision)


def _read_turn_continuation(result: hk.HookResult) -> d.ContinuationDecision:
    return result.turn_continuation


async def _apply_turn_continuation(
    input: S.TurnContinuation,
    mine: d.ContinuationDecision,
    next_: Next[S.TurnContinuation, d.ContinuationDecision],
) -> d.ContinuationDecision:
    if not mine.WhichOneof("decision"):
        return await next_()
    return await next_(dataclasses.replace(input, decision=mine))


# -- agent/turn-stop: the plugin makes the turn's stop terminal -------------------------


def _fill_turn_stop(input: S.TurnStop, call: hk.HookCall) -> None:
    call.turn_stop.SetInParent()  # the call names the seam; it carries nothing else


def _read_turn_stop(result: hk.HookResult) -> hk.TurnStopResult:
    return result.turn_stop


def _decide_turn_stop(input: S.TurnStop, mine: hk.TurnStopResult) -> d.ContinuationStop | None:
    return d.ContinuationStop() if mine.stop else None


# -- agent/compact: the plugin writes the summary that replaces a history range ---------


def _fill_compact(input: S.Compact, call: hk.HookCall) -> None:
    payload = call.compact
    payload.SetInParent()
    payload.messages.extend(input.messages)
    payload.instructions = input.instructions
    payload.trigger = input.trigger  # type: ignore[assignment]
    payload.tokens_before = input.tokens_before
    payload.summary = input.summary


def _read_compact(result: hk.HookResult) -> hk.CompactResult:
    return result.compact


async def _apply_compact(
    input: S.Compact, mine: hk.CompactResult, next_: Next[S.Compact, str]
) -> str:
    if not mine.summary:  # no summary: the plugin abstains
        return await next_()
    return await next_(dataclasses.replace(input, summary=mine.summary))


def _prompt_text(input: S.PromptSubmit) -> str:
    return prompt_text(input.content)


AGENT_CODECS: tuple[Codec, ...] = (
    Transform(
        S.PROMPT_SUBMIT, _fill_prompt_submit, _read_prompt_submit, _apply_prompt_submit,
        Facets(prompt=_prompt_text),
    ),
    Wrap(S.SESSION_PREFIX, _fill_session_prefix, _read_session_prefix, _apply_session_prefix),
    Check(S.PRE_STEP, _fill_pre_step, _read_pre_step, _decide_pre_step),
    Transform(S.REQUEST, _fill_request, _read_request, _apply_request),
    Transform(S.STEP_RESULT, _fill_step_result, _read_step_result, _apply_step_result),
    Transform(
        S.TURN_CONTINUATION, _fill_turn_continuation, _read_turn_continuation,
        _apply_turn_continuation,
    ),
    Check(S.TURN_STOP, _fill_turn_stop, _read_turn_stop, _decide_turn_stop),
    Transform(S.COMPACT, _fill_compact, _read_compact, _apply_compact),
)  # fmt: skip
"""The codecs of the agent seams a plugin can subscribe to."""
