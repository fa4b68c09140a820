"""A plugin's description: checking it, and the operator's overrides applied to it."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import duration_pb2

from agentloop.plugin.conditions import invalid_conditions
from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.ids import ID_PATTERN
from server.kernel.jsonvalue import check_lossless
from server.plugins.listeners import SEAM_NAMES
from server.plugins.tools import tool_schema


@dataclass(frozen=True)
class Overrides:
    """Operator overrides applied on top of a plugin's own description."""

    order: int | None = None
    timeout: float | None = None
    failure_policy: hk.FailurePolicy.ValueType = hk.FAILURE_POLICY_UNSPECIFIED


PROTOCOL_VERSION = 1
"""The plugin protocol version this server speaks."""
CAPABILITIES = (
    "model_stream", "tool_execute", "event_kinds", "buffer_size", "call_batch", "observe_only",
    "match_conditions",
)  # fmt: skip
"""The optional features this server offers plugins."""


def describe_request(max_message_bytes: int) -> hk.DescribeRequest:
    """What the server tells a plugin about itself when it asks for its description."""
    return hk.DescribeRequest(
        protocol_version=PROTOCOL_VERSION,
        max_message_bytes=max_message_bytes,
        capabilities=CAPABILITIES,
    )


def invalid_description(
    description: hk.DescribeResponse, taken_tools: set[str], taken_providers: set[str]
) -> str:
    """What is wrong with a plugin's description; empty when nothing is."""
    if description.protocol_version not in (0, PROTOCOL_VERSION):
        return f"protocol version {description.protocol_version} (this server speaks 1)"
    unknown_capabilities = sorted(set(description.capabilities) - set(CAPABILITIES))
    if unknown_capabilities:
        return f"it requires capabilities this server does not offer: {unknown_capabilities}"
    if not ID_PATTERN.fullmatch(description.name):
        return f"name {description.name!r} must be 1-128 letters, digits, '.', '_', ':', '-'"
    kinds = {f.name for f in ev.SessionEvent.DESCRIPTOR.oneofs_by_name["payload"].fields}
    for index, subscription in enumerate(description.subscriptions):
        unknown = sorted(set(subscription.event_kinds) - kinds)
        if unknown:
            return f"unknown session event kinds {unknown} (known: {sorted(kinds)})"
        seam = seam_name(subscription.seam)
        if subscription.seam not in SEAM_NAMES:
            return f"a subscription names seam {seam}, which cannot be subscribed to"
        if subscription.failure_policy not in hk.FailurePolicy.values():
            return f"the subscription to {seam} has an unknown failure policy"
        if subscription.HasField("timeout") and subscription.timeout.ToNanoseconds() <= 0:
            return f"the subscription to {seam} has a timeout of zero or less"
        if subscription.observe_only and subscription.seam == hk.SEAM_TOOLS_APPROVAL:
            return f"the subscription to {seam} cannot be observe_only: an approver answers"
        if problem := invalid_conditions(index, subscription):
            return problem
    names = [tool.name for tool in description.tools]
    for name in names:
        if not name or names.count(name) > 1:
            return f"tool name {name!r} is empty or repeated"
        if name in taken_tools:
            return f'tool "{name}" is already provided'
    for tool in description.tools:
        if tool.HasField("timeout") and tool.timeout.ToNanoseconds() <= 0:
            return f'tool "{tool.name}" has a timeout of zero or less'
        try:
            check_lossless(tool_schema(tool), "its input schema")
        except (ValueError, TypeError) as error:
            return f'tool "{tool.name}": its input schema is not valid JSON ({error})'
    for model in description.models:
        if not ID_PATTERN.fullmatch(model.provider):
            return f"model provider name {model.provider!r} is not valid"
        if model.provider in taken_providers:
            return f'model provider "{model.provider}" is already served'
        if model.HasField("timeout") and model.timeout.ToNanoseconds() <= 0:
            return f'model provider "{model.provider}" has a timeout of zero or less'
    return ""


def seam_name(seam: int) -> str:
    """The contract name of a seam number, or the number itself when it is unknown."""
    try:
        return hk.Seam.Name(seam)  # type: ignore[arg-type]
    except ValueError:
        return str(seam)


def effective(subscription: hk.Subscription, overrides: Overrides) -> hk.Subscription:
    """A subscription with the operator's overrides applied."""
    result = hk.Subscription()
    result.CopyFrom(subscription)
    if overrides.order is not None:
        result.order = overrides.order
    if overrides.timeout is not None:
        result.timeout.CopyFrom(seconds_to_duration(overrides.timeout))
    if overrides.failure_policy:
        result.failure_policy = overrides.failure_policy
    if not result.failure_policy:
        result.failure_policy = hk.FAILURE_POLICY_FAIL_CLOSED
    return result


def effective_tool(tool: hk.ToolDefinition, overrides: Overrides) -> hk.ToolDefinition:
    """A tool definition with the operator's timeout applied."""
    result = hk.ToolDefinition()
    result.CopyFrom(tool)
    if overrides.timeout is not None:
        result.timeout.CopyFrom(seconds_to_duration(overrides.timeout))
    return result


def seconds_to_duration(seconds: float) -> duration_pb2.Duration:
    """A Duration of `seconds`."""
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(int(seconds * 1e9))
    return duration
