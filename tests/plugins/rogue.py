r"""A plugin written on raw grpcio that breaks the `Handle` protocol (used by tests/e2e).

    python tests/plugins/rogue.py --listen 127.0.0.1:0 --name rogue --garbage 1

prints `plugin NAME listening on HOST:PORT`, then serves until killed. It subscribes to
`agent/prompt-submit` (FAIL_CLOSED) and rewrites the prompt to `TEXT-R`, except:

- `--garbage N`: its first N calls are answered with bytes that do not decode;
- `--extras`: before each answer it sends a result for an unknown call id, and after
  it the same answer again (a duplicate);
- `--unknown-kind`: it answers with a field number no `HookResult` has (a decision
  of a kind from a newer protocol);
- `--abort`: it ends the `Handle` stream with status INTERNAL (naming an address)
  instead of answering.

- `--answer-notifications` (with `--observe-only`): it answers the notifications its
  observe-only subscription gets;
- `--die-after-cancel`: it ends the `Handle` stream when a call is cancelled;
- `--bad-name`: its description names it `bad name!` (not an id);
- `--silent-error`: it answers an error outcome with no message;
- `--chunk-answer`: it answers with a model chunk (a call that is no `model_stream`).

With `--pre-execute` it subscribes to `tools/pre-execute` instead (answering "allow").
With `--observe-only` its subscription is observe-only (it lists the capability).
With `--strict-steps` it answers an error to a `prompt_submit` call whose step is not
0, as the spec numbers it.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agentloop.plugin.v1 import hook_service_pb2 as hk
from agentloop.v1 import content_pb2 as c
from agentloop.v1 import decision_pb2 as d

GARBAGE = b"\xff\xff\xff\xff\xff"
"""A truncated varint: no protobuf message decodes from it."""


def unknown_kind(call_id: str) -> bytes:
    """A HandleResponse whose result's only decision is field 99 (unknown to the server)."""
    result = hk.HookResult(call_id=call_id).SerializeToString()
    result += bytes([0x9A, 0x06, 0x00])  # tag (99 << 3 | 2) as a varint, then length 0
    return b"\x0a" + bytes([len(result)]) + result  # HandleResponse.result, field 1


class Rogue:
    """The Describe and Handle handlers."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.garbage_left = args.garbage

    async def describe(self, request: hk.DescribeRequest, context: Any) -> hk.DescribeResponse:
        seam = hk.SEAM_TOOLS_PRE_EXECUTE if self.args.pre_execute else hk.SEAM_PROMPT_SUBMIT
        capabilities = []
        if self.args.drop_batches:  # listed, then every batch dropped (single calls only)
            capabilities.append("call_batch")
        if self.args.observe_only:
            capabilities.append("observe_only")
        return hk.DescribeResponse(
            name="bad name!" if self.args.bad_name else self.args.name,
            version="rogue",
            subscriptions=[
                hk.Subscription(
                    seam=seam,
                    failure_policy=hk.FAILURE_POLICY_FAIL_CLOSED,
                    observe_only=self.args.observe_only,
                )
            ],
            capabilities=capabilities,
        )

    def answer(self, call: hk.HookCall) -> list[bytes]:
        """The bytes written for one call, in order."""
        if self.garbage_left > 0:
            self.garbage_left -= 1
            return [GARBAGE]
        if self.args.unknown_kind:
            return [unknown_kind(call.call_id)]
        if self.args.silent_error:
            result = hk.HookResult(call_id=call.call_id, error=hk.CallError(code=2))
            return [hk.HandleResponse(result=result).SerializeToString()]
        if self.args.chunk_answer:
            chunk = hk.ModelChunk(call_id=call.call_id)
            return [hk.HandleResponse(chunk=chunk).SerializeToString()]
        if self.args.strict_steps and call.step != 0:
            error = hk.CallError(message=f"prompt_submit at step {call.step}, not 0")
            return [
                hk.HandleResponse(
                    result=hk.HookResult(call_id=call.call_id, error=error)
                ).SerializeToString()
            ]
        if self.args.pre_execute:
            return [
                hk.HandleResponse(result=hk.HookResult(call_id=call.call_id)).SerializeToString()
            ]
        text = "".join(b.text.text for b in call.prompt_submit.content) + "-R"
        decision = d.PromptDecision(
            allow=d.PromptAllow(content=[c.ContentBlock(text=c.TextBlock(text=text))])
        )
        real = hk.HandleResponse(
            result=hk.HookResult(call_id=call.call_id, prompt_submit=decision)
        ).SerializeToString()
        if not self.args.extras:
            return [real]
        stray = hk.HandleResponse(result=hk.HookResult(call_id="no-such-call"))
        return [stray.SerializeToString(), real, real]

    async def handle(self, requests: AsyncIterator[hk.HandleRequest], context: Any) -> None:
        async for request in requests:
            kind = request.WhichOneof("kind")
            if kind == "cancel" and self.args.die_after_cancel:
                return
            if kind != "call":
                continue
            notice = request.call.kind == hk.CALL_KIND_NOTIFICATION
            if notice and not self.args.answer_notifications:
                continue
            if self.args.abort:
                await context.abort(grpc.StatusCode.INTERNAL, "backend 10.9.8.7:6 refused")
            for raw in self.answer(request.call):
                await context.write(raw)


async def serve(args: argparse.Namespace) -> None:
    """Serve until killed."""
    rogue = Rogue(args)
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Describe": grpc.unary_unary_rpc_method_handler(
            rogue.describe,
            request_deserializer=hk.DescribeRequest.FromString,
            response_serializer=hk.DescribeResponse.SerializeToString,
        ),
        # Raw bytes out: the handler writes exactly what it wants on the wire.
        "Handle": grpc.stream_stream_rpc_method_handler(
            rogue.handle,
            request_deserializer=hk.HandleRequest.FromString,
            response_serializer=lambda raw: raw,
        ),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("agentloop.plugin.v1.HookService", handlers),)
    )
    port = server.add_insecure_port(args.listen)
    await server.start()
    host = args.listen.rpartition(":")[0]
    print(f"plugin {args.name} listening on {host}:{port}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    """Parse the command line and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--name", default="rogue")
    parser.add_argument("--garbage", type=int, default=0)
    parser.add_argument("--extras", action="store_true")
    parser.add_argument("--drop-batches", action="store_true")
    parser.add_argument("--unknown-kind", action="store_true")
    parser.add_argument("--abort", action="store_true")
    parser.add_argument("--pre-execute", action="store_true")
    parser.add_argument("--observe-only", action="store_true")
    parser.add_argument("--answer-notifications", action="store_true")
    parser.add_argument("--die-after-cancel", action="store_true")
    parser.add_argument("--bad-name", action="store_true")
    parser.add_argument("--strict-steps", action="store_true")
    parser.add_argument("--silent-error", action="store_true")
    parser.add_argument("--chunk-answer", action="store_true")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
