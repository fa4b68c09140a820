"""SQLite to PostgreSQL: a real server's SQLite file moved into a real PostgreSQL,
interrupted and resumed, verified, then served by a server on PostgreSQL."""

from __future__ import annotations

import io
from pathlib import Path

import asyncpg
import grpc
import pytest

from agentloop.v1 import agent_service_pb2 as api
from server.kernel.errors import AlreadyExists, FailedPrecondition
from server.portable import jsonl
from server.portable.move import move_sessions
from server.portable.transfer import import_sessions
from server.settings.config import Config
from server.stores import Commit, StoreUnavailable
from server.stores.memory import MemoryStore
from server.stores.postgres import PostgresStore
from server.stores.sqlite import SqliteStore
from tests.e2e.conftest import READ_TIMEOUT, EventStream, of_kind, running_app
from tests.e2e.test_approvals import ALLOW, WORD_COUNT_THEN_DONE, approval_options, refused
from tests.e2e.test_durability import create, list_events, running_server
from tests.postgres import drop_database, fresh_database
from tests.test_portable import sample, served_sessions, sessions_command, snapshot


class FailingAfter(PostgresStore):
    """A PostgreSQL store whose commits fail (an outage) after the first `left`."""

    def __init__(self, dsn: str, left: int) -> None:
        super().__init__(dsn)
        self.left = left

    async def commit(self, commit: Commit) -> None:
        if self.left == 0:
            raise StoreUnavailable("the PostgreSQL store: connection lost")
        self.left -= 1
        await super().commit(commit)


@pytest.mark.timeout(180)
async def test_an_interrupted_move_resumes_verifies_and_a_server_takes_over(
    tmp_path: Path, postgres_server: str
) -> None:
    data = tmp_path / "data"
    await served_sessions(data)  # three sessions: a fork, a pending steering message
    source = SqliteStore(data / "agentloop.db")
    dsn = await fresh_database(postgres_server)
    try:
        broken = FailingAfter(dsn, left=1)
        with pytest.raises(StoreUnavailable):
            await move_sessions(source, broken)
        assert len(await broken.list_ids()) == 1  # one whole session, the others absent
        await broken.close()
        original = await snapshot(source)
        await source.close()

        code, err = await sessions_command("--data-dir", str(data), "move", "--to-postgres", dsn)
        assert code == 0, err
        assert "moved 2 sessions (1 already there); verified 3 sessions" in err
        assert "counts and checksums match" in err
        target = PostgresStore(dsn)
        assert await snapshot(target) == original
        await target.close()

        config = Config(listen="127.0.0.1:0", store="postgres", postgres_dsn=dsn, agents=())
        async with running_app(config) as e2e:
            await e2e.resume("again", "forked")  # its pending steering message runs now
            assert (await e2e.wait_idle("again")).idle
            page = await e2e.agents.ListSessionEvents(
                api.ListSessionEventsRequest(session_id="forked", page_size=1000)
            )
            ids = [e.user_message.request_id for e in page.events if e.HasField("user_message")]
            assert "later" in ids
            await e2e.send("again", "one more")
            assert (await e2e.wait_idle("again")).idle
            ends = [e for e in page.events if e.HasField("turn_end")]
            assert ends and ends[-1].turn_end.turn >= 2  # numbering went on after the fork
    finally:
        await drop_database(postgres_server, dsn)


async def test_a_move_refuses_a_target_session_with_other_contents(
    tmp_path: Path, postgres_server: str
) -> None:
    data = tmp_path / "data"
    await served_sessions(data)
    dsn = await fresh_database(postgres_server)
    try:
        code, err = await sessions_command("--data-dir", str(data), "move", "--to-postgres", dsn)
        assert code == 0, err
        conn = await asyncpg.connect(dsn)
        await conn.execute(
            "UPDATE sessions SET driver = 'someone-else' WHERE session_id = 'second'"
        )
        await conn.close()
        code, err = await sessions_command("--data-dir", str(data), "move", "--to-postgres", dsn)
        assert code == 1 and 'session "second" is in the target with other contents' in err
        source, target = SqliteStore(data / "agentloop.db"), PostgresStore(dsn)
        with pytest.raises(AlreadyExists):
            await move_sessions(source, target)
        await source.close()
        await target.close()
    finally:
        await drop_database(postgres_server, dsn)


@pytest.mark.timeout(180)
async def test_a_crashed_servers_pending_approval_and_answered_requests_move(
    tmp_path: Path, postgres_server: str
) -> None:
    """A SQLite server killed while a tool call waits for approval, moved to PostgreSQL:
    the approval comes along as the crash left it (its turn closes as interrupted on
    resume, answering it is stale), and a retry of the call that started the turn is
    answered from its moved request record, not run twice."""
    ask = api.SendMessageRequest(agent_id="asker", text="count", request_id="ask-1")
    async with running_server(tmp_path) as server:
        session_id = await create(server, "asker", approval_options(*WORD_COUNT_THEN_DONE))
        first = await server.agents.SendMessage(ask, timeout=READ_TIMEOUT)
        with EventStream(server.agents, agent_id="asker", from_seq=first.next_seq) as stream:
            requested = (await stream.until("approval_requested")).approval_requested
        await server.crash()

    dsn = await fresh_database(postgres_server)
    try:
        code, err = await sessions_command(
            "--data-dir", str(tmp_path / "data"), "move", "--to-postgres", dsn
        )
        assert code == 0, err
        assert "verified 1 sessions" in err and "1 request records" in err
        config = Config(listen="127.0.0.1:0", store="postgres", postgres_dsn=dsn, agents=())
        async with running_app(config) as e2e:
            moved = await list_events(e2e, session_id)  # type: ignore[arg-type]
            [waiting] = of_kind(moved, "approval_requested")
            assert waiting.approval_requested.approval_id == requested.approval_id
            assert not of_kind(moved, "approval_resolved")  # pending, as the crash left it
            await e2e.resume("asker", session_id)  # its stored options
            code_, info = await refused(
                e2e.agents.ResolveApproval(
                    api.ResolveApprovalRequest(
                        agent_id="asker", approval_id=requested.approval_id, decision=ALLOW
                    ),
                    timeout=READ_TIMEOUT,
                )
            )
            assert (code_, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "APPROVAL_STALE")
            after = await list_events(e2e, session_id)  # type: ignore[arg-type]
            assert after[-1].turn_end.reason.WhichOneof("kind") == "interrupted"
            again = await e2e.agents.SendMessage(ask, timeout=READ_TIMEOUT)
            assert again == first  # the first answer, from the moved record
            assert (await e2e.wait_idle("asker")).idle
            final = await list_events(e2e, session_id)  # type: ignore[arg-type]
            asked = [e for e in of_kind(final, "user_message") if e.user_message.request_id]
            assert [e.user_message.request_id for e in asked] == ["ask-1"]  # not run twice
            assert len(final) == len(after)
    finally:
        await drop_database(postgres_server, dsn)


class MarkFailsOnce(MemoryStore):
    """A store that loses its connection once, as the disposal mark is written."""

    def __init__(self) -> None:
        super().__init__(persistent=True)
        self.failed = False

    async def mark_disposed(self, session_id: str, at_ns: int) -> None:
        if not self.failed:
            self.failed = True
            raise StoreUnavailable("the store: connection lost")
        await super().mark_disposed(session_id, at_ns)


async def test_a_disposal_mark_lost_to_an_interruption_is_put_back_by_the_rerun() -> None:
    """The mark is written after the session's commit: a move cut off in between leaves
    the session whole and unmarked, and the rerun marks it (then verifies it)."""
    source = MemoryStore(persistent=True)
    sessions = jsonl.read_sessions(io.StringIO(sample()))
    sessions[1].disposed_ns = 1764662400123456789  # "b"'s agent was disposed
    await import_sessions(source, sessions)
    target = MarkFailsOnce()
    with pytest.raises(StoreUnavailable):
        await move_sessions(source, target)
    assert await target.list_ids() == ["a", "b"]  # "b" committed, its mark not written
    assert (await target.summary("b")).disposed_ns == 0
    moved = await move_sessions(source, target)
    assert (moved.copied, moved.skipped, moved.sessions) == (0, 2, 2)
    assert (await target.summary("b")).disposed_ns == 1764662400123456789
    # A target whose mark differs from the source's fails the verification.
    await target.mark_disposed("a", 5)
    with pytest.raises(FailedPrecondition, match='session "a": the target differs'):
        await move_sessions(source, target)
