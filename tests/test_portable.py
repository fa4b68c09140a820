"""Export and import of sessions: a real server's SQLite file, a real PostgreSQL, the
`agentloop-server sessions` command as a subprocess, and corrupt files refused whole."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path

import pytest

from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import agent_service_pb2 as api
from agentloop.v1 import session_event_pb2 as ev
from server.kernel.errors import AlreadyExists
from server.portable import jsonl
from server.portable.jsonl import CorruptExport
from server.portable.transfer import export_sessions, import_sessions
from server.settings.config import AgentConfig, Config
from server.stores import INBOX_STEERING, Commit, InboxEntry, SessionStore, SessionWrites
from server.stores.memory import MemoryStore
from server.stores.postgres import PostgresStore
from server.stores.sqlite import SqliteStore
from tests.e2e.conftest import running_app
from tests.postgres import drop_database, fresh_database

ROOT = Path(__file__).resolve().parents[1]


async def sessions_command(*args: str, wait: float = 60) -> tuple[int, str]:
    """`python -m server sessions ARGS`: exit code and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", "sessions", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(proc.communicate(), wait)
    assert proc.returncode is not None
    return proc.returncode, stderr.decode()


async def served_sessions(data_dir: Path) -> None:
    """Real sessions in a SQLite file: turns with tool calls, a fork, a pending message,
    a session whose agent was disposed ("second"), and a delete's own request record
    (of the session "gone", deleted with a request id)."""
    agent = AgentConfig(id="assistant", tools=("word_count", "current_time"))
    config = Config(listen="127.0.0.1:0", data_dir=str(data_dir), agents=(agent,))
    async with running_app(config) as e2e:
        for text in ("count these four words", "and these three", "what time is it"):
            await e2e.send("assistant", text)
            assert (await e2e.wait_idle("assistant")).idle
        [session] = [s for s in await e2e.list_sessions() if s.agent_id == "assistant"]
        await e2e.fork(session.session_id, new_session_id="forked")
        await e2e.create("second", session_id="second")
        await e2e.agents.SendMessage(  # its answer is kept: a retry gets it again
            api.SendMessageRequest(agent_id="second", text="hello", request_id="hello-1")
        )
        assert (await e2e.wait_idle("second")).idle
        await e2e.dispose("second")
        await e2e.create("third", session_id="gone")
        await e2e.agents.DeleteSession(
            api.DeleteSessionRequest(session_id="gone", dispose_agent=True, request_id="erase-1")
        )
    store = SqliteStore(data_dir / "agentloop.db")
    pending = InboxEntry(1, INBOX_STEERING, ev.UserMessage(request_id="later"))
    await store.commit(Commit({"forked": SessionWrites(inbox_put=[pending])}))
    await store.close()


async def snapshot(store: SessionStore) -> dict[str, tuple[object, ...]]:
    """Every session of a store: header, events as bytes, inbox, options, driver, its
    request records with their times (to the microsecond, as every store keeps them)
    and when its agent was disposed."""
    result: dict[str, tuple[object, ...]] = {}
    for session_id in await store.list_ids():
        s = await store.load(session_id)
        events = [e.SerializeToString(deterministic=True) for e in s.events]
        requests = [
            (r, r.stored_ns // 1000) for r in await store.session_requests(session_id)
        ]  # fmt: skip
        disposed_ns = (await store.summary(session_id)).disposed_ns
        result[session_id] = (s.header, events, s.inbox, s.options, s.driver, requests, disposed_ns)
    return result


@pytest.mark.timeout(180)  # a server, three commands and PostgreSQL on a shared machine
async def test_round_trip_through_sqlite_and_postgres_is_byte_equal(
    tmp_path: Path, postgres_server: str
) -> None:
    source_dir = tmp_path / "source"
    await served_sessions(source_dir)
    exported = tmp_path / "sessions.jsonl"
    code, err = await sessions_command("--data-dir", str(source_dir), "export", "-o", str(exported))
    assert code == 0, err
    assert "exported 3 sessions" in err
    lines = exported.read_text().splitlines()
    assert json.loads(lines[0]) == {"format": "agentloop-sessions", "version": 2}
    assert "end" in json.loads(lines[-1])
    records = [json.loads(line)["request"] for line in lines if line.startswith('{"request"')]
    [request] = [r for r in records if r["request_id"] == "hello-1"]
    assert request["agent_id"] == "second" and request["method"] == "SendMessage"
    # A delete's own record has no session to travel with: it stays in the source store.
    assert "erase-1" not in [r["request_id"] for r in records]
    described = {s["id"]: s for s in (json.loads(line).get("session") for line in lines) if s}
    assert described["second"]["disposed_ns"] > 0  # "second"'s agent was disposed
    assert "disposed_ns" not in described["forked"]

    dsn = await fresh_database(postgres_server)
    try:
        code, err = await sessions_command(
            "--data-dir", str(tmp_path / "copy"), "import", str(exported)
        )
        assert code == 0, err
        code, err = await sessions_command("--postgres", dsn, "import", str(exported))
        assert code == 0, err
        source = SqliteStore(source_dir / "agentloop.db")
        copy = SqliteStore(tmp_path / "copy" / "agentloop.db")
        pg = PostgresStore(dsn)
        try:
            original = await snapshot(source)
            assert original["forked"][2]  # the pending entry travelled
            assert original["second"][5]  # and the request record
            assert original["second"][6]  # and the disposal
            assert await snapshot(copy) == original
            assert await snapshot(pg) == original
            erased = await source.find_request("session/gone", "erase-1")
            assert erased is not None and erased.method == "DeleteSession"
            assert await copy.find_request("session/gone", "erase-1") is None
            assert await pg.find_request("session/gone", "erase-1") is None
            for store in (copy, pg):  # export(import(export)) is the same file, byte for byte
                again = io.StringIO()
                await export_sessions(store, await store.list_ids(), again)
                assert again.getvalue() == exported.read_text()
        finally:
            for store in (source, copy, pg):
                await store.close()
        # A second import conflicts, names the id, and changes nothing.
        code, err = await sessions_command("--postgres", dsn, "import", str(exported))
        assert code == 1 and "already exists" in err and "nothing was imported" in err
    finally:
        await drop_database(postgres_server, dsn)


def sample() -> str:
    """A small valid file of two sessions."""
    sessions = []
    for name, count in (("a", 3), ("b", 2)):
        events = [
            ev.SessionEvent(seq=i, turn_start=ev.TurnStart(turn=i)) for i in range(1, count + 1)
        ]
        sessions.append(
            jsonl.PortableSession(
                name, session_pb2.SessionHeader(cwd="/w"), agent_pb2.AgentOptions(), "x",
                events, [InboxEntry(1, "message", ev.UserMessage(request_id="r"))],
            )
        )  # fmt: skip
    body = "".join(line for s in sessions for line in jsonl.session_lines(s))
    return jsonl.header_line() + body + jsonl.end_line(2, 5)


def corrupt(lines: list[str], number: int, replacement: str | None) -> str:
    """The file with line `number` (from 1) replaced, or removed when None."""
    changed = list(lines)
    if replacement is None:
        del changed[number - 1]
    else:
        changed[number - 1] = replacement
    return "\n".join(changed) + "\n"


def with_requests() -> list[str]:
    """`sample()` with a request record in session "b" (its session line counts it)."""
    lines = sample().splitlines()
    described = json.loads(lines[6])
    described["session"]["requests"] = 1
    lines[6] = json.dumps(described)
    record = {"agent_id": "x", "request_id": "r1", "method": "SendMessage",
              "response": "CAE=", "stored_ns": 1764662400123456000}  # fmt: skip
    lines.insert(10, json.dumps({"request": record}))
    return lines


async def test_request_records_travel_and_a_bad_one_is_refused_naming_its_line() -> None:
    lines = with_requests()
    [session_a, session_b] = jsonl.read_sessions(line + "\n" for line in lines)
    assert session_a.requests == []
    [record] = session_b.requests
    assert (record.agent_id, record.request_id, record.response) == ("x", "r1", b"\x08\x01")
    assert record.stored_ns == 1764662400123456000
    store = MemoryStore()
    await import_sessions(store, [session_a, session_b])
    [stored] = await store.session_requests("b")
    assert stored == record and stored.stored_ns == record.stored_ns
    assert await store.find_request("x", "r1") == record  # a retry is answered from it
    again = io.StringIO()
    await export_sessions(store, ["a", "b"], again)
    exported = jsonl.read_sessions(io.StringIO(again.getvalue()))
    assert exported == [session_a, session_b]
    assert exported[1].requests[0].stored_ns == record.stored_ns
    broken = {
        "response": ("CAE", "response must be base64"),
        "stored_ns": (-1, "stored_ns must be a non-negative integer"),
        "method": ("", "needs agent_id, request_id and method"),
    }
    for key, (value, problem) in broken.items():
        bad = json.loads(lines[10])
        bad["request"][key] = value
        changed = [*lines[:10], json.dumps(bad), *lines[11:]]
        with pytest.raises(CorruptExport) as refused:
            jsonl.read_sessions(line + "\n" for line in changed)
        assert refused.value.line == 11 and problem in str(refused.value)
    # A version 1 file has no request records: a request line there is refused.
    old = [lines[0].replace('"version":2', '"version":1'), *lines[1:]]
    with pytest.raises(CorruptExport) as refused:
        jsonl.read_sessions(line + "\n" for line in old)
    assert refused.value.line == 7 and "need format version 2" in str(refused.value)


@pytest.mark.parametrize(
    ("number", "replacement", "line", "problem"),
    [
        (None, None, 10, "without its end line"),  # truncated: the end line is gone
        (3, '{"event": {"seq": 2, "turn', 3, "is not JSON"),
        (4, None, 4, "event 3 of session"),  # a gap: event 2 removed
        (3, '{"event": {"seq": 1, "turnStart": {"turn": "x"}}}', 3, "not a SessionEvent"),
        (3, '{"event": {"seq": 1}}', 3, "has no payload"),
        (1, '{"format": "agentloop-sessions", "version": 3}', 1, "format version 3"),
        (
            6,
            '{"request": {"agent_id": "x", "request_id": "r", "method": "M",'
            ' "response": "", "stored_ns": 1}}',
            6,
            "a request line where none is due",
        ),
        (7, '{"session": {"id": "a", "events": 2, "inbox": 1}}', 7, "appears twice"),
        (6, '{"inbox": {"entry_id": 1, "kind": "other", "message": {}}}', 6, "inbox kind"),
        (11, '{"end": {"sessions": 3, "events": 5}}', 11, "end line counts 3 sessions"),
        (
            7,
            '{"session": {"id": "b", "events": 2, "inbox": 1, "disposed_ns": -5}}',
            7,
            "disposed_ns must be a non-negative integer",
        ),
    ],
)
async def test_a_corrupt_file_is_refused_naming_the_line_and_imports_nothing(
    number: int | None, replacement: str | None, line: int, problem: str
) -> None:
    lines = sample().splitlines()
    assert len(lines) == 11
    text = corrupt(lines, number or 11, replacement)
    with pytest.raises(CorruptExport) as refused:
        jsonl.read_sessions(io.StringIO(text))
    assert refused.value.line == line and problem in str(refused.value)
    assert str(refused.value).startswith(f"line {line}: ")


async def test_a_disposal_travels_and_a_resume_after_the_import_clears_it() -> None:
    lines = sample().splitlines()
    described = json.loads(lines[6])
    described["session"]["disposed_ns"] = 1764662400123456789
    lines[6] = json.dumps(described)
    sessions = jsonl.read_sessions(line + "\n" for line in lines)
    assert [s.disposed_ns for s in sessions] == [0, 1764662400123456789]
    store = MemoryStore(persistent=True)
    await import_sessions(store, sessions)
    assert (await store.summary("a")).disposed_ns == 0
    assert (await store.summary("b")).disposed_ns == 1764662400123456789
    again = io.StringIO()
    await export_sessions(store, ["a", "b"], again)
    assert jsonl.read_sessions(io.StringIO(again.getvalue())) == sessions
    await store.commit(Commit({"b": SessionWrites(driver="resumed")}))  # as a resume does
    assert (await store.summary("b")).disposed_ns == 0


async def test_a_file_reads_back_and_a_conflict_imports_nothing() -> None:
    sessions = jsonl.read_sessions(io.StringIO(sample()))
    assert [(s.session_id, len(s.events), len(s.inbox)) for s in sessions] == [
        ("a", 3, 1),
        ("b", 2, 1),
    ]
    store = MemoryStore(persistent=True)
    await store.commit(Commit({"b": SessionWrites(create=sessions[0].header)}))
    with pytest.raises(AlreadyExists, match='session "b" already exists'):
        await import_sessions(store, sessions)
    assert await store.list_ids() == ["b"]  # "a", first in the file, was not imported


async def test_the_command_refuses_a_truncated_file_with_its_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(sample().splitlines()[:5]) + "\n")
    code, err = await sessions_command("--data-dir", str(tmp_path / "d"), "import", str(broken))
    assert code == 1 and "line 5: the file ends here without its end line" in err
    assert not (tmp_path / "d").exists()  # refused before the store was opened


async def test_an_export_naming_an_unknown_session_writes_no_file(tmp_path: Path) -> None:
    data = tmp_path / "d"
    store = SqliteStore(data / "agentloop.db")
    await store.open()
    await store.close()
    out = tmp_path / "out.jsonl"
    code, err = await sessions_command("--data-dir", str(data), "export", "nope", "-o", str(out))
    assert code == 1 and 'session "nope" not found' in err
    assert not out.exists()
