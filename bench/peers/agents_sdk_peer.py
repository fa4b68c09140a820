"""The benchmark conversation on the OpenAI Agents SDK (`openai-agents`), as a worker.

    python -m bench.peers.agents_sdk_peer --turns 300 --window 50

`Runner.run` with a scripted `Model` (the SDK's own model interface): a user message
gets a `word_count` function call, a function call's output gets the answer text.
Each turn's input is the previous run's `to_input_list()` and the new prompt. Tracing
is off (it would export to the network).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from itertools import count
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from bench.peers import PROMPT, Turn, answer, run_worker, word_count

_ids = count(1)


class ScriptedModel(Model):
    """Calls `word_count` on a user message; answers a function call's output."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        last = input[-1] if isinstance(input, list) else {"role": "user", "content": input}
        n = next(_ids)
        output: Any
        if last.get("type") == "function_call_output":
            said = answer(last["output"])
            text = ResponseOutputText(type="output_text", text=said, annotations=[])
            output = ResponseOutputMessage(
                id=f"msg_{n}", type="message", role="assistant", status="completed", content=[text]
            )
        else:
            output = ResponseFunctionToolCall(
                id=f"fc_{n}", type="function_call", call_id=f"call_{n}", name="word_count",
                arguments=json.dumps({"text": last["content"]}), status="completed",
            )  # fmt: skip
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the benchmark runs without streaming")


@function_tool(name_override="word_count")
async def word_count_tool(text: str) -> str:
    """Counts the whitespace-separated words of the given text."""
    return word_count(text)


def main() -> None:
    set_tracing_disabled(True)
    agent = Agent(name="bench", instructions="", model=ScriptedModel(), tools=[word_count_tool])

    async def new() -> Turn:
        history: list[Any] = []

        async def turn() -> None:
            nonlocal history
            result = await Runner.run(agent, [*history, {"role": "user", "content": PROMPT}])
            assert result.final_output == answer(word_count(PROMPT)), result.final_output
            history = result.to_input_list()

        return turn

    run_worker(__doc__, new)


if __name__ == "__main__":
    main()
