"""What a human-approval round trip costs a turn, the human aside.

Workload: an in-process server (memory store) on a real port; one scripted agent whose
turn is one word_count call then an answer. Each round runs the same number of turns
without approval and with `approval_required_tools: [word_count]`, where the client
answers `ResolveApproval` (allow once) as soon as the stream shows the request. The
figures are medians over the turns of a round, and the median of the per-round ratios.

    python -m bench.approval_bench [--turns N] [--rounds N]

Nothing here asserts a timing: the figures are printed for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import TYPE_CHECKING, Any

import grpc

from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_factory_service_pb2_grpc as fac_rpc
from agentloop.v1 import agent_pb2, approval_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import agent_service_pb2_grpc as api_rpc
from server.edge.app import App
from server.models.scripted_options import script_options
from server.settings.config import Config

if TYPE_CHECKING:
    from agentloop.v1.agent_service_pb2_grpc import AgentServiceAsyncStub


def options(approval: bool, turns: int) -> agent_pb2.AgentOptions:
    call = scripted_pb2.ScriptedToolCall(
        name="word_count", arguments=json.dumps({"text": "one two three"})
    )
    steps = [scripted_pb2.ScriptedStep(tool_calls=[call]), scripted_pb2.ScriptedStep(text="ok")]
    return agent_pb2.AgentOptions(
        provider="scripted",
        model="m",
        tools=["word_count"],
        approval_required_tools=["word_count"] if approval else [],
        provider_options=script_options(steps * turns),
    )


async def run_turns(
    agents: AgentServiceAsyncStub, agent_id: str, turns: int
) -> tuple[list[float], list[float]]:
    """Seconds per turn, and from the request seen to the turn's end (approval only)."""
    per_turn: list[float] = []
    after_request: list[float] = []
    for _ in range(turns):
        began = time.perf_counter()
        sent = await agents.SendMessage(api.SendMessageRequest(agent_id=agent_id, text="go"))
        stream = agents.StreamSessionEvents(
            api.StreamSessionEventsRequest(agent_id=agent_id, from_seq=sent.next_seq)
        )
        seen = 0.0
        async for batch in stream:
            done = False
            for event in batch.events:
                kind = event.WhichOneof("payload")
                if kind == "approval_requested":
                    seen = time.perf_counter()
                    await agents.ResolveApproval(
                        api.ResolveApprovalRequest(
                            agent_id=agent_id,
                            approval_id=event.approval_requested.approval_id,
                            decision=approval_pb2.APPROVAL_DECISION_ALLOW_ONCE,
                        )
                    )
                done = done or kind == "turn_end"
            if done:
                break
        stream.cancel()
        end = time.perf_counter()
        per_turn.append(end - began)
        if seen:
            after_request.append(end - seen)
    return per_turn, after_request


async def main(turns: int, rounds: int) -> None:
    app = App(Config(listen="127.0.0.1:0", store="memory", agents=()))
    port = await app.start()
    ratios: list[float] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            factory: Any = fac_rpc.AgentFactoryServiceStub(channel)
            agents: AgentServiceAsyncStub = api_rpc.AgentServiceStub(channel)
            for index in range(rounds):
                medians: dict[bool, float] = {}
                tail = 0.0
                for approval in (False, True):
                    agent_id = f"{'ap' if approval else 'plain'}-{index}"
                    await factory.CreateAgent(
                        fac.CreateAgentRequest(agent_id=agent_id, options=options(approval, turns))
                    )
                    per_turn, after = await run_turns(agents, agent_id, turns)
                    await factory.DisposeAgent(fac.DisposeAgentRequest(agent_id=agent_id))
                    medians[approval] = statistics.median(per_turn)
                    if approval:
                        tail = statistics.median(after) * 1e3
                ratios.append(medians[True] / medians[False])
                print(
                    f"round {index + 1}: turn without approval {medians[False] * 1e3:.2f} ms,"
                    f" with an immediate API approval {medians[True] * 1e3:.2f} ms"
                    f" (request seen -> turn end {tail:.2f} ms)"
                )
    finally:
        await app.stop(grace=0)
    print(
        f"approval turn / plain turn (median of {rounds} rounds): {statistics.median(ratios):.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.turns, arguments.rounds))
