"""The benchmark conversation on LangGraph (LangChain's `create_agent`), as a worker.

    python -m bench.peers.langgraph_peer --turns 300 --window 50

`create_agent` (a LangGraph graph; `langgraph.prebuilt.create_react_agent`'s successor)
with a scripted chat model (a LangChain `BaseChatModel`, async):
a human message gets a `word_count` tool call, a tool message gets the answer text.
The conversation is a thread of an in-memory checkpointer, as LangGraph keeps one.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from bench.peers import PROMPT, Turn, answer, run_worker, word_count

_ids = count(1)


class ScriptedChatModel(BaseChatModel):
    """Calls `word_count` on a human message; answers a tool message."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self  # the script knows its one tool

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        last = messages[-1]
        n = next(_ids)
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=answer(str(last.content)), id=f"msg_{n}")
        else:
            call = {"name": "word_count", "args": {"text": last.content}, "id": f"call_{n}"}
            reply = AIMessage(content="", tool_calls=[call], id=f"msg_{n}")
        return ChatResult(generations=[ChatGeneration(message=reply)])

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        return self._generate(messages)  # no thread hop: the script does no I/O


@tool("word_count")
async def word_count_tool(text: str) -> str:
    """Counts the whitespace-separated words of the given text."""
    return word_count(text)


def main() -> None:
    graph = create_agent(ScriptedChatModel(), [word_count_tool], checkpointer=InMemorySaver())
    threads = count(1)

    async def new() -> Turn:
        config = {"configurable": {"thread_id": f"bench-{next(threads)}"}}

        async def turn() -> None:
            state = await graph.ainvoke({"messages": [HumanMessage(PROMPT)]}, config)
            assert state["messages"][-1].content == answer(word_count(PROMPT))

        return turn

    run_worker(__doc__, new)


if __name__ == "__main__":
    main()
