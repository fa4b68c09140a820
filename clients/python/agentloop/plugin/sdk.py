"""Write an agentloop plugin in a few lines: decorate handlers, then serve.

```python
from agentloop.plugin.sdk import (
    Plugin, block_prompt, finish_chunk, last_user_text, text_chunks, text_of
)

plugin = Plugin("guard", version="1.0")

@plugin.prompt_submit(order=10)
async def no_rm(call):
    if "rm -rf" in text_of(call.prompt_submit.content):
        return block_prompt("destructive command")
    return None  # continue unchanged

@plugin.tool("shout", description="Upper-cases text", parallel_safe=True)
async def shout(args, call):
    return args["text"].upper()

@plugin.model("shouty", default_model="v1")
async def shouty(call):  # an async generator of StreamChunks, or a function returning text
    for chunk in text_chunks(last_user_text(call.model_stream.messages).upper()):
        yield chunk
    yield finish_chunk()

plugin.run("127.0.0.1:50100")
```

A seam handler receives the `HookCall` (agent, session, turn, step, and the seam's
payload, e.g. `call.prompt_submit`) and returns `None` ("continue unchanged") or the
seam's decision, built with the constructors re-exported here from
`agentloop.plugin.decisions`. A handler that raises answers `HookResult.error` with the
exception text. Observers (`on_session_event`, `on_agent_event`, `on_tool_result`) get
no answer; so does a seam subscribed with `observe_only=True`, which the plugin only
watches: the server sends its calls as notifications and never waits for them. A tool
handler receives the parsed JSON arguments and the call, and returns
text, content blocks, a `ToolOutput`, or any other JSON value (sent as JSON text). A
model handler streams the answer of a model call (see `agentloop.plugin.models`).
While the server traces, `call.traceparent` holds its span of the call, and with
OpenTelemetry installed here each handler runs in a child span of it
(`agentloop.plugin.tracing`).

Registrations and the running of one call live in `agentloop.plugin.calls`; the
serving side (the `Handle` stream: concurrent calls, `CancelCall`, the token check) in
`agentloop.plugin.service`.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Unpack

from agentloop.plugin.calls import (
    Decorator,
    Handler,
    Options,
    Registry,
    ToolHandler,
    ToolReturn,
    tool_definition,
)
from agentloop.plugin.decisions import (
    accept,
    add_context,
    add_contexts,
    allow_prompt,
    allow_tool,
    approve_once,
    ask,
    block_prompt,
    block_result,
    context,
    continue_turn,
    deny,
    reject_tool,
    replace_config,
    replace_message,
    replace_prefix,
    stop_turn,
    terminal_stop,
    text_block,
    text_of,
    tool_error,
    tool_output,
)
from agentloop.plugin.models import (
    ERROR,
    MAX_TOKENS,
    REASONING,
    STOP,
    TEXT,
    ModelHandler,
    ModelProvider,
    ModelReturn,
    finish_chunk,
    last_user_text,
    model_definition,
    text_chunks,
    tool_call_chunks,
    usage_chunk,
)
from agentloop.plugin.seam_table import BY_PATH, BY_SEAM
from agentloop.plugin.service import PluginServer
from agentloop.plugin.transport import MAX_MESSAGE_BYTES
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import decision_pb2 as d

__all__ = [
    "ERROR",
    "FAIL_CLOSED",
    "FAIL_OPEN",
    "MAX_TOKENS",
    "REASONING",
    "STOP",
    "TEXT",
    "Handler",
    "ModelHandler",
    "ModelReturn",
    "Options",
    "Plugin",
    "ToolHandler",
    "ToolReturn",
    "accept",
    "add_context",
    "add_contexts",
    "allow_prompt",
    "allow_tool",
    "approve_once",
    "ask",
    "block_prompt",
    "block_result",
    "context",
    "continue_turn",
    "deny",
    "finish_chunk",
    "last_user_text",
    "reject_tool",
    "replace_config",
    "replace_message",
    "replace_prefix",
    "stop_turn",
    "terminal_stop",
    "text_block",
    "text_chunks",
    "text_of",
    "tool_call_chunks",
    "tool_error",
    "tool_output",
    "usage_chunk",
]

FAIL_CLOSED = hs.FAILURE_POLICY_FAIL_CLOSED
"""A failed call ends the turn with reason `error` (the default)."""

FAIL_OPEN = hs.FAILURE_POLICY_FAIL_OPEN
"""A failed call skips the plugin for that call; the skip is counted."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""The plugin name alphabet: the same as agent ids."""


class Plugin:
    """A plugin: its seam handlers and tools, served as an agentloop `HookService`.

    Every seam method takes the subscription options `order` (lower first, default
    0), `timeout` (seconds per call), `failure_policy` (`FAIL_CLOSED` or `FAIL_OPEN`)
    and `agent_ids` (default: every agent), and returns the decorator registering the
    seam's one handler. Match conditions limit the calls the server makes at all (the
    others cost no round trip): `agent_labels` on any seam, `tools` (names or globs) on
    the tool seams, `event_kinds` on the event observers, `prompt_prefix` and
    `prompt_regex` on `prompt_submit`; a condition the seam does not take is refused
    when the server registers the plugin.
    """

    def __init__(
        self,
        name: str,
        version: str = "",
        *,
        token: str | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        """Name it (letters, digits, `.`, `_`, `:`, `-`); `token` requires that bearer.

        `max_message_bytes` must be at least the server's `pluginMaxMessageBytes`.
        """
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(f"plugin name {name!r}: 1-128 letters, digits, '.', '_', ':', '-'")
        self.name = name
        self.version = version
        self.token = token
        self.max_message_bytes = max_message_bytes
        self.registry = Registry(name)
        self._server: PluginServer | None = None

    # Transforming seams: the handler returns the seam's decision, or None (unchanged).

    def prompt_submit(self, **options: Unpack[Options]) -> Decorator[d.PromptDecision]:
        """`agent/prompt-submit`: `allow_prompt(content, contexts)` or `block_prompt(reason)`."""
        return self._subscribe(hs.SEAM_PROMPT_SUBMIT, options)

    def session_prefix(self, **options: Unpack[Options]) -> Decorator[hs.SessionPrefixResult]:
        """`agent/session-prefix`: `replace_prefix(messages)`."""
        return self._subscribe(hs.SEAM_SESSION_PREFIX, options)

    def pre_step(self, **options: Unpack[Options]) -> Decorator[hs.PreStepResult]:
        """`agent/pre-step`: `add_context(text)` or `add_contexts(items)`."""
        return self._subscribe(hs.SEAM_PRE_STEP, options)

    def request(self, **options: Unpack[Options]) -> Decorator[hs.RequestResult]:
        """`agent/request`: `replace_config(call.request.config, temperature=...)`."""
        return self._subscribe(hs.SEAM_REQUEST, options)

    def step_result(self, **options: Unpack[Options]) -> Decorator[hs.StepResultResult]:
        """`agent/step-result`: `replace_message(message)`."""
        return self._subscribe(hs.SEAM_STEP_RESULT, options)

    def compact(self, **options: Unpack[Options]) -> Decorator[hs.CompactResult]:
        """`agent/compact`: `hs.CompactResult(summary=...)` writes a compaction's summary."""
        return self._subscribe(hs.SEAM_COMPACT, options)

    def turn_continuation(self, **options: Unpack[Options]) -> Decorator[d.ContinuationDecision]:
        """`agent/turn-continuation`: `continue_turn(reason)` or `stop_turn()`."""
        return self._subscribe(hs.SEAM_TURN_CONTINUATION, options)

    def turn_stop(self, **options: Unpack[Options]) -> Decorator[hs.TurnStopResult]:
        """`agent/turn-stop`: `terminal_stop()`."""
        return self._subscribe(hs.SEAM_TURN_STOP, options)

    def tools_pre_execute(self, **options: Unpack[Options]) -> Decorator[d.PreToolDecision]:
        """`tools/pre-execute`: `allow_tool()`, `deny(reason)` or `ask(reason)`."""
        return self._subscribe(hs.SEAM_TOOLS_PRE_EXECUTE, options)

    def tools_post_execute(self, **options: Unpack[Options]) -> Decorator[d.PostToolDecision]:
        """`tools/post-execute`: `accept(content, contexts)` or `block_result(feedback)`."""
        return self._subscribe(hs.SEAM_TOOLS_POST_EXECUTE, options)

    # Observers: notifications, never answered; the handler's return value is ignored.

    def on_session_event(self, **options: Unpack[Options]) -> Decorator[object]:
        """Every session event (`call.session_event.event`, `.dropped`)."""
        return self._subscribe(hs.SEAM_SESSION_EVENTS, options)

    def on_agent_event(self, **options: Unpack[Options]) -> Decorator[object]:
        """Every live agent event (`call.agent_event.event`, `.dropped`)."""
        return self._subscribe(hs.SEAM_AGENT_EVENTS, options)

    def on_tool_result(self, **options: Unpack[Options]) -> Decorator[object]:
        """Every final tool result (`call.tool_result.invocation`, `.output`)."""
        return self._subscribe(hs.SEAM_TOOLS_RESULT, options)

    # Approvers: the handler answers a pending approval, or returns None to abstain.

    def tools_approval(self, **options: Unpack[Options]) -> Decorator[hs.ToolApprovalResult]:
        """`tools/approval`: `approve_once()` or `reject_tool(reason)` (`call.tool_approval`).

        The first answer wins (this or ResolveApproval); a call whose approval ended
        otherwise is cancelled. Without a `timeout` it waits as long as the approval.
        """
        return self._subscribe(hs.SEAM_TOOLS_APPROVAL, options)

    # Any seam of the table, by its path or `Seam` value: a seam newer than this helper's
    # methods needs no code here.

    def on(self, seam: str | hs.Seam.ValueType, **options: Unpack[Options]) -> Decorator[Any]:
        """Subscribe to `seam` ("agent/request" or `SEAM_REQUEST`), as its method would."""
        spec = BY_PATH.get(seam) if isinstance(seam, str) else BY_SEAM.get(seam)
        if spec is None:
            raise ValueError(f"plugin {self.registry.name}: no seam {seam!r} in the seam table")
        return self._subscribe(spec.seam, options)

    def _subscribe(self, seam: hs.Seam.ValueType, options: Options) -> Decorator[Any]:
        def register(handler: Handler[Any]) -> Handler[Any]:
            self.registry.subscribe(seam, handler, options)
            return handler

        return register

    def tool(
        self,
        name: str,
        *,
        description: str = "",
        schema: Mapping[str, Any] | None = None,
        parallel_safe: bool = False,
        timeout: float | None = None,
        agent_ids: Iterable[str] = (),
    ) -> Callable[[ToolHandler], ToolHandler]:
        """Provide a tool; `schema` is the JSON schema of its arguments (an object).

        The server offers it only to agents that enable it by name in
        `AgentOptions.tools` and, when `agent_ids` is given, only to those agents.

        The handler gets the parsed JSON arguments and the call; it returns text,
        content blocks, a `ToolOutput` (`tool_output(...)`, `tool_error(...)`), or any
        other JSON value (sent as JSON text). Arguments that are not JSON answer a
        `tool_error` without calling it.
        """

        def register(handler: ToolHandler) -> ToolHandler:
            definition = tool_definition(name, description, schema, parallel_safe, timeout)
            definition.agent_ids.extend(agent_ids)
            self.registry.add_tool(definition, handler)
            return handler

        return register

    def model(
        self, provider: str, *, default_model: str = "", timeout: float | None = None
    ) -> Callable[[ModelHandler], ModelHandler]:
        """Serve the model provider `provider`; agents select it with `AgentOptions.provider`.

        `default_model` is the model of agents that name none; `timeout` (seconds) is
        the longest silence between two chunks (default: the server's, 60 s). The
        handler gets the call (`call.model_stream`: `provider`, `header`, `messages`;
        the model is `header.config.model`) and is an async generator of
        `StreamChunk`s (`text_chunks`, `tool_call_chunks`, `usage_chunk`,
        `finish_chunk`; a finish `STOP` is appended when it ends without one), or an
        async function returning text (one text block), chunks, or None.
        """
        if not NAME_PATTERN.fullmatch(provider):
            raise ValueError(
                f"provider name {provider!r}: 1-128 letters, digits, '.', '_', ':', '-'"
            )

        def register(handler: ModelHandler) -> ModelHandler:
            definition = model_definition(provider, default_model, timeout)
            self.registry.add_model(ModelProvider(definition, handler))
            return handler

        return register

    def describe(self) -> hs.DescribeResponse:
        """The `Describe` answer: name, version, subscriptions (in seam order), tools, models."""
        return self.registry.describe(self.version)

    async def handle(self, call: hs.HookCall) -> hs.HookResult | None:
        """Run one seam or tool call as `Handle` would: its result, or None when none is sent.

        A `model_stream` call streams chunks: run it with `responses(call)`.
        """
        return await self.registry.run(call)

    def responses(self, call: hs.HookCall) -> AsyncGenerator[hs.HandleResponse]:
        """Run any call as `Handle` would: everything sent for it, in order.

        A model call gives its `chunk`s (the last with the finish) or ends with a
        `result` carrying `error`; other calls give their one `result`, if any.
        """
        return self.registry.responses(call)

    async def serve(
        self, address: str = "127.0.0.1:0", *, tls_key: str = "", tls_cert: str = ""
    ) -> int:
        """Start serving on `address` (port 0 picks a free one); returns the bound port.

        `unix:/path` serves on a Unix domain socket instead (the server must allow it:
        its `pluginAllowlist` names the socket or its directory).

        With `tls_key` and `tls_cert` (PEM file paths) the plugin serves TLS; register it
        as `tls://host:port`.
        """
        if self._server is not None:
            raise RuntimeError(f"plugin {self.name} is already serving")
        if bool(tls_key) != bool(tls_cert):
            raise ValueError("TLS needs both tls_key and tls_cert")
        tls = read_key_pair(tls_key, tls_cert) if tls_key else None
        server = PluginServer(self, self.max_message_bytes)
        port = await server.start(address, tls)
        self._server = server
        return port

    async def stop(self, grace: float | None = 5.0) -> None:
        """Stop: refuse new calls, answer those in flight, cancel what is left after `grace`."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)

    def run(
        self, address: str = "127.0.0.1:50100", *, tls_key: str = "", tls_cert: str = ""
    ) -> None:
        """Serve until SIGTERM or SIGINT; prints `plugin NAME listening on HOST:PORT`."""
        asyncio.run(self._run_until_signal(address, tls_key, tls_cert))

    async def _run_until_signal(self, address: str, tls_key: str, tls_cert: str) -> None:
        port = await self.serve(address, tls_key=tls_key, tls_cert=tls_cert)
        stop_requested = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # before announcing: a SIGTERM is graceful
            loop.add_signal_handler(sig, stop_requested.set)
        bound = address if address.startswith("unix:") else f"{address.rpartition(':')[0]}:{port}"
        print(f"plugin {self.name} listening on {bound}", flush=True)
        try:
            await stop_requested.wait()
        finally:
            await self.stop()


def read_key_pair(key_file: str, cert_file: str) -> tuple[bytes, bytes]:
    """The PEM bytes of a TLS private key and its certificate chain."""
    return Path(key_file).read_bytes(), Path(cert_file).read_bytes()
