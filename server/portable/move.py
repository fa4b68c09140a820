"""Moving every session of one store into another (SQLite to PostgreSQL), resumably.

Each session is copied in one commit of the target, so after an interruption (a
SIGKILL, an outage) a session is in the target whole or not at all; a rerun skips
those already there (after checking they equal the source) and copies the rest. At
the end every session is read back from the target and compared with the source:
the counts of sessions, events and pending inbox entries, and a SHA-256 per session
over its header, options, driver, events, inbox (deterministic protobuf bytes) and
the request records written with it (so a retry after the move is still answered).
A disposal mark (when the session's agent was disposed) is written after the
session's commit, so a rerun puts back one an interruption left out, and the
verification compares it too.
The source must be stopped (or draining): a session that grows during the move is
reported as a mismatch, never silently truncated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from server.kernel.errors import AlreadyExists, FailedPrecondition
from server.portable.jsonl import PortableSession
from server.portable.transfer import mark_disposed, read_portable
from server.stores import Commit, SessionStore, SessionWrites


@dataclass
class Moved:
    """What a move did, and what the target holds of the source at the end."""

    copied: int = 0
    skipped: int = 0
    """Sessions a previous, interrupted run had copied already."""
    sessions: int = 0
    events: int = 0
    inbox: int = 0
    requests: int = 0


def checksum(session: PortableSession) -> str:
    """SHA-256 of everything a session holds, as deterministic protobuf bytes.

    All but its disposal mark, which a move writes after the session's commit (and a
    rerun puts back): `disposed_ns` is compared on its own.
    """
    digest = hashlib.sha256()

    def add(data: bytes) -> None:
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)

    add(session.session_id.encode())
    add(session.header.SerializeToString(deterministic=True))
    add(session.options.SerializeToString(deterministic=True) if session.options else b"-")
    add(session.driver.encode())
    for event in session.events:
        add(event.SerializeToString(deterministic=True))
    for entry in session.inbox:
        add(f"{entry.entry_id}:{entry.kind}".encode())
        add(entry.message.SerializeToString(deterministic=True))
    for record in session.requests:
        add(f"{record.agent_id}\0{record.request_id}\0{record.method}\0{record.stored_ns}".encode())
        add(record.response)
    return digest.hexdigest()


async def move_sessions(
    source: SessionStore, target: SessionStore, progress: Callable[[str], None] = lambda _: None
) -> Moved:
    """Copy every session of `source` missing from `target`, then verify them all."""
    moved = Moved()
    ids = await source.list_ids()
    sums: dict[str, str] = {}
    disposals: dict[str, int] = {}
    for number, session_id in enumerate(ids, start=1):
        session = await read_portable(source, session_id)
        sums[session_id] = checksum(session)
        disposals[session_id] = session.disposed_ns
        if await target.exists(session_id):
            if checksum(await read_portable(target, session_id)) != sums[session_id]:
                raise AlreadyExists(
                    f'session "{session_id}" is in the target with other contents:'
                    " not a session this move copied"
                )
            moved.skipped += 1
        else:
            writes = SessionWrites(
                create=session.header,
                driver=session.driver,
                options=session.options,
                events=list(session.events),
                inbox_put=list(session.inbox),
                requests=list(session.requests),
            )
            await target.commit(Commit({session_id: writes}))
            moved.copied += 1
        await mark_disposed(target, session)
        if number % 100 == 0:
            progress(f"{number}/{len(ids)} sessions")
    for session_id in ids:  # the verification: everything read back from the target
        there = await read_portable(target, session_id)
        if checksum(there) != sums[session_id] or there.disposed_ns != disposals[session_id]:
            raise FailedPrecondition(
                f'session "{session_id}": the target differs from the source'
                " (did the source change during the move?)",
                "MOVE_MISMATCH",
                session_id=session_id,
            )
        moved.sessions += 1
        moved.events += len(there.events)
        moved.inbox += len(there.inbox)
        moved.requests += len(there.requests)
    return moved
