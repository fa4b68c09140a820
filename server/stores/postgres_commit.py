"""A group commit as one statement: the arguments of `agentloop_commit` and its refusals.

The function (`postgres_schema.COMMIT_FUNCTION`) takes the commit as columns: one
array per field, per session and per kind of row. Sent as one prepared statement
outside any explicit transaction, the whole commit is one round trip and one
transaction, with the NOTIFY sent at its end.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from server.kernel.errors import AgentLoopError, AlreadyExists, SessionNotFound
from server.stores import (
    FIRST_SEQ,
    Commit,
    SessionWrites,
    StoreConflict,
    check_fence,
    check_follows,
    turn_of,
)
from server.stores.kinds import KIND_NUMBERS

PARAMETERS = 26

COMMIT = f"SELECT agentloop_commit({', '.join(f'${n}' for n in range(1, PARAMETERS + 1))})"

EXISTS, UNKNOWN, REFUSED = "AL409", "AL404", "AL412"
"""The SQLSTATEs the function raises (see `postgres_schema.COMMIT_FUNCTION`)."""


def arguments(commit: Commit, channel: str) -> list[Any]:
    """The function's arguments for `commit`; `StoreConflict` for events with a gap."""
    ids: list[str] = []
    headers: list[bytes | None] = []
    create_ns: list[int] = []
    drivers: list[str] = []
    options: list[bytes | None] = []
    follows: list[int] = []
    counts: list[int] = []
    turns: list[int] = []
    fences: list[int] = []
    events: tuple[list[str], list[int], list[int], list[bytes]] = ([], [], [], [])
    puts: tuple[list[str], list[int], list[str], list[bytes]] = ([], [], [], [])
    takes: tuple[list[str], list[int]] = ([], [])
    requests: tuple[list[str], list[str], list[str], list[bytes], list[str], list[int]] = (
        [], [], [], [], [], [],
    )  # fmt: skip
    for session_id, writes in commit.sessions.items():
        if writes.empty():
            continue
        appended = writes.events
        stored = appended[0].seq - FIRST_SEQ if appended else 0
        check_follows(session_id, stored, appended)
        header = writes.create
        ids.append(session_id)
        headers.append(header.SerializeToString() if header is not None else None)
        create_ns.append(header.create_time.ToNanoseconds() if header is not None else 0)
        drivers.append(writes.driver)
        options.append(writes.options.SerializeToString() if writes.options is not None else None)
        follows.append(stored)
        counts.append(len(appended))
        turns.append(turn_of(appended))
        fences.append(writes.fence)
        for event in appended:
            events[0].append(session_id)
            events[1].append(event.seq)
            events[2].append(KIND_NUMBERS[event.WhichOneof("payload") or "turn_end"])
            events[3].append(writes.encode(event))
        for entry in writes.inbox_put:
            puts[0].append(session_id)
            puts[1].append(entry.entry_id)
            puts[2].append(entry.kind)
            puts[3].append(entry.message.SerializeToString())
        for entry_id in writes.inbox_take:
            takes[0].append(session_id)
            takes[1].append(entry_id)
        for record in writes.requests:
            requests[0].append(record.agent_id)
            requests[1].append(record.request_id)
            requests[2].append(record.method)
            requests[3].append(record.response)
            requests[4].append(session_id)
            requests[5].append(record.stored_ns)
    return [
        ids, headers, create_ns, drivers, options, follows, counts, turns, fences,
        *events, *puts, *takes, *requests, channel,
    ]  # fmt: skip


def refusal(error: asyncpg.PostgresError, commit: Commit) -> AgentLoopError | None:
    """What a refusal the function raised means (None: not one of its refusals)."""
    code = getattr(error, "sqlstate", "")
    session_id = str(getattr(error, "message", ""))
    if code == EXISTS:
        return AlreadyExists(f'session "{session_id}" already exists')
    if code == UNKNOWN:
        return SessionNotFound(session_id)
    if code != REFUSED:
        return None
    fence, count = (int(part) for part in str(getattr(error, "detail", "0 0")).split())
    writes = commit.sessions.get(session_id, SessionWrites())
    try:
        check_fence(session_id, fence, writes.fence)
    except StoreConflict as fenced:
        return fenced
    first = writes.events[0].seq if writes.events else FIRST_SEQ + count
    follow = f"event {first} does not follow the {count} stored"
    return StoreConflict(f'session "{session_id}": {follow}')


def witness(commit: Commit) -> tuple[str, list[Any]] | None:
    """A query for a row only `commit` writes, and the bytes it holds if the commit landed.

    Its first session's events, else its new header, else its first inbox entry (their
    bytes carry their times and content: another writer's do not match). None when the
    commit writes no such row (a retry of it is harmless: it changes nothing twice).
    """
    for session_id, writes in commit.sessions.items():
        if writes.events:
            events = writes.events
            return (
                "SELECT array_agg(event ORDER BY seq) = $4 FROM events"
                " WHERE session_id = $1 AND seq BETWEEN $2 AND $3",
                [session_id, events[0].seq, events[-1].seq, [writes.encode(e) for e in events]],
            )
        if writes.create is not None:
            return (
                "SELECT header = $2 FROM sessions WHERE session_id = $1",
                [session_id, writes.create.SerializeToString()],
            )
        if writes.inbox_put:
            entry = writes.inbox_put[0]
            return (
                "SELECT message = $3 FROM inbox WHERE session_id = $1 AND entry_id = $2",
                [session_id, entry.entry_id, entry.message.SerializeToString()],
            )
    return None
