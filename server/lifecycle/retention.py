"""The retention sweeper: removes what the config's `retention:` no longer keeps.

A sweep drops request records older than the retry window, then walks every stored
session in batches of `sweep_batch`: a session no agent drives, with no pending
message, whose last event (or, with none, its creation) is older than
`idle_session_days`, or whose agent was disposed more than `disposed_session_days`
ago (the store records the disposal; a resume clears it), is deleted as
`DeleteSession` deletes one (`deletion.py`: the id is held meanwhile, a live or
leased session is refused and skipped). Each session is
its own transaction, so a sweep killed midway leaves every session whole or gone, and
the next sweep goes on; nothing holds a lock across sessions, and the event loop runs
other work between two batches. Freed space is given back at the end (`reclaim`).

On replicas one sweeper works at a time: a sweep runs only while it holds the store's
`retention-sweeper` lease (PostgreSQL: an advisory lock that dies with its replica).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from server.kernel.errors import FailedPrecondition, NotFound, SessionDamaged
from server.kernel.tasks import cancel_and_wait
from server.lifecycle.deletion import delete_session
from server.lifecycle.factory import AgentFactory
from server.settings.retention import Retention

if TYPE_CHECKING:  # metrics are imported only when they are on
    from server.observability.metrics import Metrics

log = logging.getLogger(__name__)

LEASE = "retention-sweeper"
DAY_NS = 86_400 * 10**9
HOUR_NS = 3_600 * 10**9


@dataclass
class SweepReport:
    """What one sweep saw and did."""

    ran: bool = True
    """False when another replica held the lease: this one did nothing."""
    sessions: int = 0
    """Stored sessions it kept."""
    events: int = 0
    """Events of the sessions it kept."""
    oldest_ns: int = 0
    """The last activity (ns since the epoch) of the least recently active session kept."""
    sessions_swept: int = 0
    requests_swept: int = 0


class Sweeper:
    """Sweeps now and then, while the server runs."""

    def __init__(
        self,
        factory: AgentFactory,
        retention: Retention,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.factory = factory
        self.retention = retention
        self.clock = clock
        self.last = SweepReport(ran=False)
        """The latest sweep's report (metrics read it)."""
        self.swept_sessions = 0
        self.swept_requests = 0
        """Totals since the start."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Sweep every `sweep_interval_seconds`, the first time after one interval."""
        self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        """Stop sweeping (a sweep under way stops between two sessions)."""
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.retention.sweep_interval_seconds)
            try:
                await self.sweep()
            except Exception as error:  # a store outage: the next sweep tries again
                log.warning("retention sweep failed: %s", error)

    async def sweep(self) -> SweepReport:
        """One sweep: drop old request records, delete idle sessions, give space back."""
        store = self.factory.runtime.store
        if not await store.try_lease(LEASE):
            return SweepReport(ran=False)
        try:
            report = SweepReport()
            now = self.clock()
            batch = self.retention.sweep_batch
            if self.retention.request_record_hours:
                before = now - int(self.retention.request_record_hours * HOUR_NS)
                while True:
                    dropped = await store.drop_requests(before, batch)
                    report.requests_swept += dropped
                    self.swept_requests += dropped
                    if dropped < batch:
                        break
            ids = await store.list_ids()
            for first in range(0, len(ids), batch):
                await self._step(ids[first : first + batch], now, report)
            if report.sessions_swept or report.requests_swept:
                await store.reclaim()
        finally:
            await store.release_lease(LEASE)
        self.last = report
        if report.sessions_swept or report.requests_swept:
            log.info(
                "retention swept %d sessions and %d request records",
                report.sessions_swept, report.requests_swept,
            )  # fmt: skip
        return report

    async def _step(self, ids: list[str], now: int, report: SweepReport) -> None:
        """Examine one batch of sessions; delete the expired ones."""
        store = self.factory.runtime.store
        idle_ns = int(self.retention.idle_session_days * DAY_NS)
        disposed_ns = int(self.retention.disposed_session_days * DAY_NS)
        for session_id in ids:
            try:
                summary = await store.summary(session_id)
                count = summary.event_count
                last = await store.read(session_id, count, count + 1) if count else []
            except (NotFound, SessionDamaged):  # gone meanwhile, or for an operator to see
                continue
            active = (last[0].create_time if last else summary.header.create_time).ToNanoseconds()
            idle = bool(idle_ns) and now - active > idle_ns
            disposed = bool(disposed_ns and summary.disposed_ns) and (
                now - summary.disposed_ns > disposed_ns
            )
            expired = (idle or disposed) and not summary.pending
            if expired and session_id not in self.factory.catalogue.reserved:
                try:
                    await delete_session(self.factory, session_id, dispose=False)
                except (FailedPrecondition, NotFound):  # driven, or gone meanwhile: kept
                    pass
                else:
                    report.sessions_swept += 1
                    self.swept_sessions += 1
                    continue
            report.sessions += 1
            report.events += count
            report.oldest_ns = min(report.oldest_ns or active, active)


def watch_retention(metrics: Metrics, sweeper: Sweeper) -> None:
    """The sweeper's figures as gauges, read at scrape time (as of the latest sweep)."""

    def last() -> SweepReport:  # read anew at each scrape
        return sweeper.last

    metrics.watch("agentloop_store_sessions", "Stored sessions.", lambda: last().sessions)
    metrics.watch("agentloop_store_events", "Events of stored sessions.", lambda: last().events)
    metrics.watch(
        "agentloop_store_oldest_session_seconds",
        "Since the last activity of the least recently active stored session.",
        lambda: (sweeper.clock() - last().oldest_ns) / 1e9 if last().oldest_ns else 0.0,
    )
    metrics.watch(
        "agentloop_retention_swept_sessions",
        "Sessions deleted by retention since the start.",
        lambda: sweeper.swept_sessions,
    )
    metrics.watch(
        "agentloop_retention_swept_requests",
        "Request records dropped by retention since the start.",
        lambda: sweeper.swept_requests,
    )
