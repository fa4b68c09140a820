"""Copying sessions between a store and a portable file (`jsonl`).

An export reads each session whole from the store (one snapshot per session) and
writes its lines. An import checks the whole file first (`jsonl.read_sessions`) and
every id against the target store, so a corrupt file or a conflicting id imports
nothing; then it writes each session in commits of `CHUNK` events, the way a live
session is written (one stored run per commit, so reads of a range stay cheap), and
removes what it wrote if a write fails midway.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import IO

from server.kernel.errors import AlreadyExists
from server.portable import jsonl
from server.portable.jsonl import PortableSession
from server.stores import Commit, SessionStore, SessionWrites

log = logging.getLogger(__name__)

CHUNK = 500
"""Events per commit of an import."""


@dataclass(frozen=True)
class Totals:
    """What an export or an import carried."""

    sessions: int
    events: int
    inbox: int
    requests: int = 0


async def select(store: SessionStore, ids: Sequence[str], match: str = "") -> list[str]:
    """The sessions to export: `ids` as given, else those matching the glob (default: all)."""
    if ids:
        return list(ids)
    stored = await store.list_ids()
    return [i for i in stored if fnmatch.fnmatchcase(i, match)] if match else stored


async def read_portable(store: SessionStore, session_id: str) -> PortableSession:
    """One stored session, as the file carries it (`NotFound` if unknown)."""
    stored = await store.load(session_id)
    summary = await store.summary(session_id)
    requests = [
        replace(r, stored_ns=r.stored_ns // 1000 * 1000)  # what every store keeps: microseconds
        for r in await store.session_requests(session_id)
    ]
    return PortableSession(
        session_id,
        stored.header,
        stored.options,
        stored.driver,
        stored.events,
        stored.inbox,
        requests,
        summary.disposed_ns,
    )


async def export_sessions(store: SessionStore, ids: Sequence[str], out: IO[str]) -> Totals:
    """Write the sessions `ids` of `store` to `out` as one portable file."""
    out.write(jsonl.header_line())
    events = inbox = requests = 0
    for session_id in ids:
        session = await read_portable(store, session_id)
        out.writelines(jsonl.session_lines(session))
        events += len(session.events)
        inbox += len(session.inbox)
        requests += len(session.requests)
    out.write(jsonl.end_line(len(ids), events))
    return Totals(len(ids), events, inbox, requests)


async def check_free(store: SessionStore, sessions: Sequence[PortableSession]) -> None:
    """Raise `AlreadyExists` naming the first session id the store already holds."""
    for session in sessions:
        if await store.exists(session.session_id):
            raise AlreadyExists(
                f'session "{session.session_id}" already exists in the target store:'
                " nothing was imported (delete it there first, or leave it out of the file)"
            )


async def write_session(store: SessionStore, session: PortableSession) -> None:
    """Store one session: created with its first events, the rest in `CHUNK`s, inbox last.

    A failure midway removes what was written of it, and raises.
    """
    events = session.events
    chunks = [events[i : i + CHUNK] for i in range(0, len(events), CHUNK)] or [[]]
    try:
        for index, chunk in enumerate(chunks):
            writes = SessionWrites(events=list(chunk))
            if index == 0:
                writes.create = session.header
                writes.driver = session.driver
                writes.options = session.options
            if index == len(chunks) - 1:
                writes.inbox_put = list(session.inbox)
                writes.requests = list(session.requests)
            await store.commit(Commit({session.session_id: writes}))
        await mark_disposed(store, session)
    except BaseException:
        await _remove(store, [session.session_id])
        raise


async def mark_disposed(store: SessionStore, session: PortableSession) -> None:
    """Record the session's disposal, if it had one.

    After its commits: they name its driver, and a commit naming a driver clears the
    mark (as a resume does).
    """
    if session.disposed_ns:
        await store.mark_disposed(session.session_id, session.disposed_ns)


async def import_sessions(store: SessionStore, sessions: Sequence[PortableSession]) -> Totals:
    """Store every session of a checked file; all of them or (on a failure) none."""
    await check_free(store, sessions)
    done: list[str] = []
    try:
        for session in sessions:
            await write_session(store, session)
            done.append(session.session_id)
    except BaseException:
        await _remove(store, done)
        raise
    return Totals(
        len(sessions),
        sum(len(s.events) for s in sessions),
        sum(len(s.inbox) for s in sessions),
        sum(len(s.requests) for s in sessions),
    )


async def _remove(store: SessionStore, session_ids: Sequence[str]) -> None:
    """Take back what an import wrote (best effort: the store may be what failed)."""
    for session_id in session_ids:
        try:
            if await store.exists(session_id):
                await store.delete(session_id)
        except Exception as error:
            log.error("import: could not remove the partly written %s: %s", session_id, error)
