"""The server's instructions per turn over gRPC, A/B: this tree against other checkouts.

    python -m bench.grpc_instructions [--against DIR ...] [--turns 20,120] [--request-ids]
                                      [--store memory]

`turn_ab`'s gRPC turn (one agent; a SendMessage, then its session stream read to the
turn's `turn_end`), counted instead of timed: a server of each checkout on its defaults
(SQLite) runs under `valgrind --tool=cachegrind`, driven by a raw-stub client in this
process (not counted), for two turn counts; the difference of the two counts over the
difference of turns is one turn's instructions in the server (start-up, the agent's
creation, the warm-up turns and shutdown cancel out). The hash seed is fixed and the
fairness slice is off, as in `turn_instructions`. Counted: the server process's
user-space instructions, every thread (gRPC's poller and the SQLite commit thread
too). `--request-ids`: each message carries a new request id, as the SDKs send them
(the idempotent path: its answer is recorded with the message). `--store memory`: the
memory store instead, whose commits take no thread: the count moves less between runs
(on SQLite, how the commit thread's timing groups the commits moves a count of 120
turns by up to about 1 %; more turns average that out). Printed with each
checkout's ratio to the first `--against`; nothing is asserted.
Needs valgrind; prints a note and stops without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import math
import runpy
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import common

SCRIPT = str(Path(__file__).resolve())

WARM = 5
"""Turns before those counted, in both runs: the first turns load code and fill caches."""


def serve(argv: list[str]) -> None:
    """`python -m server ARGV` over the checkout first on PYTHONPATH, fairness slice off."""
    with contextlib.suppress(ImportError):  # an older tree has no fairness yields
        fairness: Any = importlib.import_module("server.kernel.fairness")
        fairness.SLICE = math.inf
    sys.argv = ["server", *argv]
    runpy.run_module("server", run_name="__main__", alter_sys=True)


async def drive(port: int, turns: int, request_ids: bool) -> None:
    """`WARM` + `turns` turns of one agent, over a raw stub (`turn_ab.over_grpc`'s)."""
    import grpc

    from agentloop.v1 import agent_factory_service_pb2 as fac
    from agentloop.v1 import agent_factory_service_pb2_grpc as fac_rpc
    from agentloop.v1 import agent_service_pb2 as api
    from agentloop.v1 import agent_service_pb2_grpc as api_rpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        factory = fac_rpc.AgentFactoryServiceStub(channel)
        agents = api_rpc.AgentServiceStub(channel)
        await factory.CreateAgent(fac.CreateAgentRequest(agent_id="ab", options=common.OPTIONS))
        stream = agents.StreamSessionEvents(api.StreamSessionEventsRequest(agent_id="ab"))
        request = api.SendMessageRequest(agent_id="ab", text="count me")
        for turn in range(WARM + turns):
            if request_ids:
                request.request_id = f"turn-{turn}"
            await agents.SendMessage(request)
            while True:
                batch = await stream.read()
                assert isinstance(batch, api.StreamSessionEventsResponse)
                if any(event.HasField("turn_end") for event in batch.events):
                    break
        stream.cancel()


async def counted(tree: str, turns: int, request_ids: bool = False, store: str = "sqlite") -> int:
    """Instructions of a server of checkout `tree` that served `turns` counted turns."""
    scratch = tempfile.mkdtemp(prefix="agentloop-grpc-instructions-")
    out = str(Path(scratch) / "cachegrind.out")
    config = Path(scratch) / "agentloop.yaml"
    config.write_text(f"store: {store}\n")
    port = common.free_port()
    env = dict(common.checkout_env(tree), PYTHONHASHSEED="0")
    env = {k: v for k, v in env.items() if not k.startswith(("OTEL_", "AGENTLOOP_"))}
    server = await asyncio.create_subprocess_exec(
        "valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
        sys.executable, SCRIPT, "--serve", "--config", str(config), "--listen",
        f"127.0.0.1:{port}", "--data-dir", str(Path(scratch) / "data"), "--log-level", "WARNING",
        env=env, cwd=tree or common.ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        await asyncio.wait_for(server.stdout.readline(), 300)  # "agentloop listening on ..."
        await drive(port, turns, request_ids)
        server.terminate()  # graceful: the server stops, valgrind writes its counts
        await asyncio.wait_for(server.wait(), 300)
        return common.instructions(out)
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", nargs="*", default=[], help="other checkouts' directories")
    parser.add_argument("--turns", default="20,120", help="the two turn counts, FEW,MANY")
    parser.add_argument(
        "--request-ids", action="store_true", help="each message with a request id (as the SDKs)"
    )
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.serve:
        serve(rest)
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    counts = common.counted_turns(args.turns)
    if counts is None:
        return
    few, many = counts
    trees = {"this": ""} | {tree: tree for tree in args.against}
    figures: dict[str, float] = {}
    for who, tree in trees.items():
        few_count = asyncio.run(counted(tree, few, args.request_ids, args.store))
        many_count = asyncio.run(counted(tree, many, args.request_ids, args.store))
        figures[who] = (many_count - few_count) / (many - few)
    print(
        f"the server's instructions per gRPC turn ({many} less {few} turns, cachegrind)"
        + (", each message with a request id" if args.request_ids else "")
    )
    names = list(trees)
    print(f"  {'':<28}" + "".join(f"{name[-14:]:>16}" for name in names))
    row = f"over gRPC, {'SQLite' if args.store == 'sqlite' else 'memory store'}"
    print(f"  {row:<28}" + "".join(f"{figures[w] / 1e6:>15.3f}M" for w in names))
    if args.against:
        base = args.against[0]
        print(f"  ratios to {base}")
        ratios = "".join(f"{figures[who] / figures[base]:>16.3f}" for who in names)
        print(f"  {row:<28}{ratios}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
