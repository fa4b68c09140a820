"""A plugin's registrations (seam handlers, tools, models) and the running of one `HookCall`.

Each seam travels in a `HookCall` payload field and is answered in the `HookResult`
decision field of the same name (`prompt_submit`, ..., `tool_execute`); observers'
payloads (`session_event`, `agent_event`, `tool_result`) are notifications, never
answered. `Registry.run` maps a handler's return value, or its exception, to the result.
A `model_stream` call is answered by chunks instead (`Registry.responses`; see
`agentloop.plugin.models`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict, TypeVar

from google.protobuf import duration_pb2

from agentloop.plugin.conditions import CAPABILITY as CONDITIONS
from agentloop.plugin.conditions import call_matcher
from agentloop.plugin.decisions import blocks, struct, tool_error
from agentloop.plugin.inline import never_suspends
from agentloop.plugin.seam_table import BY_PAYLOAD, BY_SEAM, SPECS, SeamSpec
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import content_pb2 as c

if TYPE_CHECKING:
    from agentloop.plugin.models import ModelProvider

log = logging.getLogger("agentloop.plugin")

D = TypeVar("D")

Handler: TypeAlias = Callable[[hs.HookCall], Awaitable[D | None]]
"""A seam handler: the call in, the seam's decision (or None: unchanged) out."""

Decorator: TypeAlias = Callable[[Handler[D]], Handler[D]]
"""What a seam method returns: registers the handler and returns it unchanged."""

ToolReturn: TypeAlias = (
    str | Sequence[c.ContentBlock] | hs.ToolOutput | Mapping[str, Any] | list[Any] | float | None
)
"""What a tool handler returns: text, blocks, an output, or JSON (sent as JSON text)."""

ToolHandler: TypeAlias = Callable[[Any, hs.HookCall], Awaitable[ToolReturn]]
"""A tool handler: the parsed JSON arguments and the call in, the result out."""


class Options(TypedDict, total=False):
    """The options of a seam subscription."""

    order: int
    """Place among the seam's listeners, lower first (default 0)."""
    timeout: float | None
    """Deadline of each call in seconds (default: the server's)."""
    failure_policy: hs.FailurePolicy.ValueType
    """`FAIL_CLOSED` (the default) or `FAIL_OPEN`."""
    agent_ids: Iterable[str]
    """Only these agents' calls (default: every agent)."""
    event_kinds: Iterable[str]
    """`on_session_event` and `on_agent_event` only: only these event kinds, such as
    "turn_end" or "status" (default: all)."""
    tools: Iterable[str]
    """Tool seams only: only calls of these tools, by name or glob ("mcp__*") (default:
    every tool)."""
    agent_labels: Mapping[str, str]
    """Only agents whose labels (`AgentOptions.labels`) hold all of these (default: any)."""
    prompt_prefix: str
    """`prompt_submit` only: only prompts whose text starts with this."""
    prompt_regex: str
    """`prompt_submit` only: only prompts whose text this regular expression is found in."""
    buffer_size: int
    """Observers only: notifications that may wait to be sent (default: the server's 1024)."""
    observe_only: bool
    """Transforming seams and checkpoints: the plugin only watches; the server sends each
    call as a notification and never waits for it (no round trip). The handler's return
    value is ignored (default: False, the server waits for the decision)."""


def duration(seconds: float) -> duration_pb2.Duration:
    """`seconds` as a protobuf Duration."""
    result = duration_pb2.Duration()
    result.FromNanoseconds(round(seconds * 1e9))
    return result


UNKNOWN, UNIMPLEMENTED = 2, 12
"""`google.rpc.Code`s of a failed call: a handler's failure; a call nothing here handles."""


def failure(call_id: str, message: str, code: int = UNKNOWN) -> hs.HookResult:
    """The answer of a call the plugin failed to handle (code UNKNOWN unless given)."""
    return hs.HookResult(call_id=call_id, error=hs.CallError(code=code, message=message))


def error_text(exc: BaseException) -> str:
    """The text `HookResult.error` carries for an exception."""
    return str(exc) or type(exc).__name__


def tool_output_of(value: ToolReturn) -> hs.ToolOutput:
    """A tool handler's return value as a `ToolOutput`."""
    if isinstance(value, hs.ToolOutput):
        return value
    if value is None or isinstance(value, str):
        return hs.ToolOutput(content=blocks(value))
    if isinstance(value, Sequence):
        content = [block for block in value if isinstance(block, c.ContentBlock)]
        if len(content) == len(value):
            return hs.ToolOutput(content=content)
    return hs.ToolOutput(content=blocks(json.dumps(value)))


@dataclass
class Subscription:
    """One registered seam handler."""

    spec: SeamSpec
    handler: Handler[Any] = field(repr=False)
    options: Options
    inline: bool = field(init=False, repr=False)
    """The handler cannot suspend: its calls run in place (`agentloop.plugin.inline`)."""

    described: hs.Subscription = field(init=False, repr=False)
    """`message()`, made once: its conditions are checked on every call."""
    matches: Callable[[hs.HookCall], bool] | None = field(init=False, repr=False)
    """Its match conditions over a call (None: it declares none), prepared once."""

    def __post_init__(self) -> None:
        self.inline = never_suspends(self.handler)
        self.described = self.message()
        conditioned = self.described.HasField("conditions")
        self.matches = call_matcher(self.described) if conditioned else None

    def message(self) -> hs.Subscription:
        """The subscription as `Describe` reports it."""
        options = self.options
        message = hs.Subscription(
            seam=self.spec.seam,
            order=options.get("order", 0),
            failure_policy=options.get("failure_policy", hs.FAILURE_POLICY_UNSPECIFIED),
            agent_ids=list(options.get("agent_ids", ())),
            buffer_size=options.get("buffer_size", 0),
            observe_only=options.get("observe_only", False),
        )
        kinds = list(options.get("event_kinds", ()))
        if self.spec.seam == hs.SEAM_SESSION_EVENTS:
            message.event_kinds.extend(kinds)  # the older field, which every server reads
        elif kinds:
            message.conditions.event_kinds.extend(kinds)
        if tools := list(options.get("tools", ())):
            message.conditions.tools.extend(tools)
        if labels := dict(options.get("agent_labels", {})):
            message.conditions.agent_labels.update(labels)
        if prefix := options.get("prompt_prefix", ""):
            message.conditions.prompt_prefix = prefix
        if regex := options.get("prompt_regex", ""):
            message.conditions.prompt_regex = regex
        timeout = self.options.get("timeout")
        if timeout is not None:
            message.timeout.CopyFrom(duration(timeout))
        return message


@dataclass
class Registry:
    """A plugin's seam handlers (one per seam), tools and model providers (unique names)."""

    name: str
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    tools: dict[str, tuple[hs.ToolDefinition, ToolHandler]] = field(default_factory=dict)
    models: dict[str, ModelProvider] = field(default_factory=dict)

    def subscribe(self, seam: hs.Seam.ValueType, handler: Handler[Any], options: Options) -> None:
        """Register the handler of `seam`."""
        spec = BY_SEAM[seam]
        if spec.payload in self.subscriptions:
            raise ValueError(f"plugin {self.name} already has a {spec.payload} handler")
        self.subscriptions[spec.payload] = Subscription(spec, handler, options)

    def add_tool(self, definition: hs.ToolDefinition, handler: ToolHandler) -> None:
        """Register a tool."""
        if not definition.name or definition.name in self.tools:
            raise ValueError(f"plugin {self.name}: tool name {definition.name!r} empty or taken")
        self.tools[definition.name] = (definition, handler)

    def add_model(self, provider: ModelProvider) -> None:
        """Register a model provider."""
        if not provider.name or provider.name in self.models:
            raise ValueError(f"plugin {self.name}: provider name {provider.name!r} empty or taken")
        self.models[provider.name] = provider

    def describe(self, version: str) -> hs.DescribeResponse:
        """The `Describe` answer: subscriptions in seam order, tools and models as registered."""
        return hs.DescribeResponse(
            name=self.name,
            version=version,
            subscriptions=[
                self.subscriptions[s.payload].message()
                for s in SPECS
                if s.payload in self.subscriptions
            ],
            tools=[definition for definition, _ in self.tools.values()],
            models=[provider.definition for provider in self.models.values()],
            protocol_version=1,
            # A server without match conditions would call it for everything: refused.
            capabilities=[CONDITIONS] if self.has_conditions() else [],
        )

    def has_conditions(self) -> bool:
        """Whether a subscription relies on match conditions."""
        return any(s.described.HasField("conditions") for s in self.subscriptions.values())

    async def responses(self, call: hs.HookCall) -> AsyncGenerator[hs.HandleResponse]:
        """Everything `Handle` sends for one call: the chunks of a model call, else its result.

        A model call's chunks come as they are produced; the last one carries the
        finish, or a result with `error` ends the call instead.
        """
        if call.WhichOneof("payload") == "model_stream":
            provider = self.models.get(call.model_stream.provider)
            if provider is not None:
                async with aclosing(provider.responses(call)) as responses:
                    async for response in responses:
                        yield response
                return
        result = await self.run(call)
        if result is not None:
            yield hs.HandleResponse(result=result)

    async def run(self, call: hs.HookCall) -> hs.HookResult | None:
        """Run one call's handler: its result, or None when nothing is to be sent.

        Nothing is sent for a notification, nor for a call whose deadline
        (`call.timeout`) passed: the server has stopped waiting for it.
        """
        limit = call.timeout.ToNanoseconds() / 1e9 if call.HasField("timeout") else 0.0
        if limit <= 0:  # a notification, or no deadline: no timer
            return await self.answer(call)
        try:
            async with asyncio.timeout(limit):
                return await self.answer(call)
        except TimeoutError:  # only the deadline's: answer() answers every error
            log.warning("plugin %s: call %s passed its deadline", self.name, call.call_id)
            return None

    async def answer(self, call: hs.HookCall) -> hs.HookResult | None:
        """`run` without the deadline, which the caller keeps.

        The handler's result, its error as a result, or None for a notification.
        """
        payload = call.WhichOneof("payload") or ""
        spec = BY_PAYLOAD.get(payload)
        sub = self.subscriptions.get(payload)
        notification = call.kind == hs.CALL_KIND_NOTIFICATION
        if sub is not None and sub.matches is not None and not sub.matches(call):
            # Outside its conditions (a server that sent it anyway): never handled; a
            # call is answered "continue unchanged", a notification not at all.
            answered = spec is not None and spec.decision is not None and not notification
            return hs.HookResult(call_id=call.call_id) if answered else None
        if spec is not None and (spec.decision is None or notification):  # a notification
            if sub is not None:
                await self._watch(sub, call)
            return None
        result = hs.HookResult(call_id=call.call_id)
        try:
            if payload == "tool_execute":
                result.tool_execute.CopyFrom(await self._run_tool(call))
            elif payload == "model_stream":
                provider = call.model_stream.provider
                if provider in self.models:
                    raise TypeError("a model_stream call streams chunks: use responses(call)")
                raise LookupError(f"plugin {self.name} serves no model provider {provider!r}")
            elif spec is None or spec.decision is None or sub is None:  # a kind it does not know
                unknown = f"plugin {self.name} has no handler for {payload or 'the call'}"
                log.warning("plugin %s: call %s: %s", self.name, call.call_id, unknown)
                return failure(call.call_id, unknown, UNIMPLEMENTED)
            elif sub.options.get("observe_only"):  # a server that sent it as a call anyway
                await self._watch(sub, call)  # answered "continue unchanged"
            elif (decision := await sub.handler(call)) is not None:
                if not isinstance(decision, spec.decision):
                    raise TypeError(
                        f"the {payload} handler returned {type(decision).__name__}, "
                        f"not {spec.decision.__name__} or None"
                    )
                getattr(result, payload).CopyFrom(decision)
        except Exception as exc:
            log.warning("plugin %s: call %s failed: %s", self.name, call.call_id, exc)
            result = failure(call.call_id, error_text(exc))
        return result

    async def _watch(self, sub: Subscription, call: hs.HookCall) -> None:
        """Run a watching handler: its value is ignored, its failure logged and contained."""
        try:
            await sub.handler(call)
        except Exception:
            log.exception("plugin %s: the %s observer failed", self.name, sub.spec.payload)

    async def _run_tool(self, call: hs.HookCall) -> hs.ToolOutput:
        invocation = call.tool_execute.invocation
        if invocation.name not in self.tools:
            raise LookupError(f"plugin {self.name} has no tool {invocation.name!r}")
        _, handler = self.tools[invocation.name]
        try:
            args = json.loads(invocation.arguments) if invocation.arguments.strip() else {}
        except ValueError as exc:
            return tool_error(f"invalid JSON arguments: {exc}", code="INVALID_ARGUMENTS")
        return tool_output_of(await handler(args, call))


def tool_definition(
    name: str,
    description: str,
    schema: Mapping[str, Any] | None,
    parallel_safe: bool,
    timeout: float | None,
) -> hs.ToolDefinition:
    """A tool's definition; no schema means an object with any properties."""
    definition = hs.ToolDefinition(
        name=name,
        description=description,
        input_schema=struct(dict(schema or {"type": "object", "properties": {}})),
        parallel_safe=parallel_safe,
    )
    if timeout is not None:
        definition.timeout.CopyFrom(duration(timeout))
    return definition
