"""The Python SDK facade (`agentloop.Client`) against a real server.

A connection that breaks mid-turn is a real one: the client talks through a TCP proxy
on loopback, which the test severs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from google.protobuf import duration_pb2

from agentloop import Client, connect, connect_sync
from agentloop.plugin.sdk import Plugin, block_prompt
from agentloop.plugin.v1 import hook_service_pb2 as hs
from agentloop.v1 import agent_pb2, decision_pb2, scripted_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.models.scripted_options import script_options
from tests.e2e.conftest import E2E, READ_TIMEOUT
from tests.e2e.registry import wait_state
from tests.plugin_client import serving


def scripted(
    *steps: scripted_pb2.ScriptedStep, tools: tuple[str, ...] = ()
) -> agent_pb2.AgentOptions:
    return agent_pb2.AgentOptions(
        provider="scripted", model="m", tools=tools, provider_options=script_options(steps)
    )


class Proxy:
    """A loopback TCP proxy whose open connections the test can cut."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )
        self.writers += [writer, upstream_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    def sever(self) -> None:
        """Cut every open connection (new ones still work)."""
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.sever()
        if self.server is not None:
            self.server.close()


@contextlib.asynccontextmanager
async def sdk(e2e: E2E) -> AsyncIterator[Client]:
    client = connect(e2e.target)
    try:
        yield client
    finally:
        await client.close()


async def test_send_returns_the_turn_that_answers_the_message(e2e: E2E) -> None:
    async with sdk(e2e) as client:
        await client.create("s1", scripted(scripted_pb2.ScriptedStep(text="hello there")))
        turn = await client.send("s1", "hi", request_id="r-1")
        events = [event async for event in turn]
        assert events[0].HasField("turn_start") and events[-1].HasField("turn_end")
        assert [e.user_message.request_id for e in events if e.HasField("user_message")] == ["r-1"]
        assert turn.end is events[-1] and turn.end.turn_end.reason.HasField("completed")
        idle = await client.wait_idle("s1", 5)
        assert idle.idle


async def test_a_message_sent_during_a_turn_gets_the_next_turn(e2e: E2E) -> None:
    nap = scripted_pb2.ScriptedToolCall(name="sleep", arguments='{"seconds": 60}')
    options = scripted(
        scripted_pb2.ScriptedStep(tool_calls=[nap]),
        scripted_pb2.ScriptedStep(text="second answer"),
        tools=("sleep",),
    )
    async with sdk(e2e) as client:
        await client.create("s2", options)
        first = await client.send("s2", "take a nap")
        async for event in first:
            if event.HasField("tool_call"):
                break  # turn 1 now sleeps; the next message waits for a later turn
        second = await client.send("s2", "and then?")
        await client.cancel("s2")  # turn 1 ends aborted; the queued message is dropped
        ending = await second.result()
        # The cancel dropped the queued message: the facade says so rather than waiting.
        assert ending.HasField("message_dropped") and second.dropped is ending
        third = await client.send("s2", "now?")
        assert (await third.result()).turn_end.turn == 2


async def test_a_turn_survives_a_broken_connection(e2e: E2E) -> None:
    proxy = Proxy(e2e.port)
    await proxy.start()
    nap = scripted_pb2.ScriptedToolCall(name="sleep", arguments='{"seconds": 60}')
    options = scripted(scripted_pb2.ScriptedStep(tool_calls=[nap]), tools=("sleep",))
    client = connect(f"127.0.0.1:{proxy.port}")
    try:
        await client.create("s3", options)
        turn = await client.send("s3", "sleep, then be cut")
        seen: list[ev.SessionEvent] = []
        async with asyncio.timeout(READ_TIMEOUT):
            async for event in turn:
                seen.append(event)
                if event.HasField("tool_call"):
                    proxy.sever()  # the turn cannot end on its own: it sleeps 60 s
                    await e2e.agents.CancelTurn(api.CancelTurnRequest(agent_id="s3"))
    finally:
        await client.close()
        await proxy.close()
    assert turn.reconnects >= 1
    assert [e.seq for e in seen] == list(range(seen[0].seq, seen[0].seq + len(seen)))
    assert seen[-1].turn_end.reason.HasField("aborted")


async def test_a_conversation_reads_every_turn_from_one_stream(e2e: E2E) -> None:
    steps = [scripted_pb2.ScriptedStep(text=f"answer {n}") for n in range(1, 5)]
    async with sdk(e2e) as client:
        await client.create("c1", scripted(*steps))
        async with client.conversation("c1") as chat:
            ends = []
            for n in range(1, 4):
                turn = await chat.send(f"message {n}", request_id=f"c1-{n}")
                events = [event async for event in turn]
                asked = [e.user_message.request_id for e in events if e.HasField("user_message")]
                assert asked == [f"c1-{n}"]
                ends.append(events[-1].turn_end.turn)
            # A turn nobody reads: the next one skips its events on the shared stream.
            await chat.send("message 4", request_id="c1-4")
            await client.wait_idle("c1", 5)
            fifth = await chat.send("message 5", request_id="c1-5")
            events = [event async for event in fifth]
            asked = [e.user_message.request_id for e in events if e.HasField("user_message")]
            assert asked == ["c1-5"] and fifth.end is events[-1]
            assert ends == [1, 2, 3] and fifth.end.turn_end.turn == 5
            assert chat.stream.calls == 1  # one stream for five turns


async def test_a_turn_read_while_another_is_being_read_opens_its_own_stream(e2e: E2E) -> None:
    steps = [scripted_pb2.ScriptedStep(text=f"answer {n}") for n in range(1, 3)]
    async with sdk(e2e) as client:
        await client.create("c2", scripted(*steps))
        async with client.conversation("c2") as chat:
            first = await chat.send("one", request_id="c2-1")
            second = await chat.send("two", request_id="c2-2")
            async with asyncio.timeout(READ_TIMEOUT):
                a, b = await asyncio.gather(first.result(), second.result())
            assert (a.turn_end.turn, b.turn_end.turn) == (1, 2)
            # One of them read the shared stream; the other opened its own.
            assert chat.stream.calls == 1


async def test_a_steer_is_answered_by_the_turn_it_joins(e2e: E2E) -> None:
    slow = scripted_pb2.ScriptedStep(
        text="slowly " * 40, chunk_size=7, chunk_delay=duration_pb2.Duration(nanos=50_000_000)
    )
    options = scripted(slow, scripted_pb2.ScriptedStep(text="steered"))
    async with sdk(e2e) as client:
        await client.create("c3", options)
        first = await client.send("c3", "talk slowly", request_id="c3-send")
        async with asyncio.timeout(READ_TIMEOUT):
            async for event in first:
                if event.HasField("assistant_chunk"):
                    break  # turn 1 streams its slow text
            steer = await client.send("c3", "shorter", request_id="c3-steer", steer=True)
            events = [event async for event in steer]
        if steer.steering:  # accepted while turn 1 ran: turn 1 takes it and answers it
            joined = [e for e in events if e.HasField("steering_message")]
            assert [e.steering_message.request_id for e in joined] == ["c3-steer"]
            assert steer.end is not None and steer.end.turn_end.turn == 1
        else:  # turn 1 ended first (a loaded machine): the steer was an ordinary message
            asked = [e.user_message.request_id for e in events if e.HasField("user_message")]
            assert asked == ["c3-steer"]
            assert steer.end is not None and steer.end.turn_end.turn == 2


async def test_a_stored_session_replays_through_the_sdk_stream(e2e: E2E) -> None:
    async with sdk(e2e) as client:
        agent = await client.create("c4", scripted(scripted_pb2.ScriptedStep(text="hi")))
        ending = await (await client.send("c4", "hello")).result()
        stream = client.stream(session_id=agent.session_id, replay_only=True)
        async with asyncio.timeout(READ_TIMEOUT):
            seqs = [event.seq async for event in stream]
        assert stream.ended and seqs == list(range(1, ending.seq + 1))
        assert [a.agent_id for a in await client.list_agents()] == ["c4"]
        assert agent.session_id in [s.session_id for s in await client.list_sessions()]


async def test_a_blocked_message_is_answered_by_the_turn_that_refused_it(e2e: E2E) -> None:
    guard = Plugin("sdk-guard")

    @guard.prompt_submit()
    async def refuse(call: hs.HookCall) -> decision_pb2.PromptDecision:
        return block_prompt("not today")

    async with serving(guard) as address, sdk(e2e) as client:
        await client.register_plugin(address)
        await wait_state(e2e.channel, "sdk-guard")
        await client.create("c5", scripted(scripted_pb2.ScriptedStep(text="never")))
        turn = await client.send("c5", "please", request_id="c5-1")
        async with asyncio.timeout(READ_TIMEOUT):
            events = [event async for event in turn]
        blocked = [e for e in events if e.HasField("prompt_blocked")]
        assert [e.prompt_blocked.request_id for e in blocked] == ["c5-1"]
        assert turn.end is events[-1] and turn.end.turn_end.reason.HasField("rejected")
        assert [p.name for p in await client.plugins()] == ["sdk-guard"]
        await client.unregister_plugin("sdk-guard")
        assert await client.plugins() == []


def sync_program(address: str) -> tuple[list[str], str, int, bool]:
    """A synchronous program: create, a turn with a tool call, a second turn, dispose."""
    with connect_sync(address, timeout=READ_TIMEOUT) as client:
        client.create(
            "sync",
            scripted(
                scripted_pb2.ScriptedStep(
                    tool_calls=[scripted_pb2.ScriptedToolCall(name="word_count", arguments="{}")]
                ),
                scripted_pb2.ScriptedStep(text="counted"),
                scripted_pb2.ScriptedStep(text="again"),
                tools=("word_count",),
            ),
        )
        kinds = [str(event.WhichOneof("payload")) for event in client.send("sync", "count")]
        second = client.send("sync", "once more").result()
        listed = len(client.list_agents())
        idle = client.wait_idle("sync", 5).idle
        client.dispose("sync")
    return kinds, second.turn_end.reason.WhichOneof("kind") or "", listed, idle


async def test_the_sync_client_runs_a_program_without_async(e2e: E2E) -> None:
    # In a thread of its own: the program blocks, the server runs on this test's loop.
    kinds, second_end, listed, idle = await asyncio.to_thread(sync_program, e2e.target)
    assert kinds[0] == "turn_start" and kinds[-1] == "turn_end"
    assert "tool_call" in kinds and "tool_result" in kinds
    assert second_end == "completed"
    assert listed == 1 and idle
