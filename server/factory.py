"""The agent factory: creation and resume as one rollback-covered transaction, and teardown.

Creation prepares the session and the agent privately, runs an optional setup step
while nothing is published, then publishes: the session and the agent enter their
registries (the final arbiter of a same-id race), `agent/created` is emitted (a
listener that throws vetoes and rolls everything back), `agent/session-start` follows,
and only then does the driver start.

Disposal: stop the driver, await its exit and pending flushes, leave the agent
registry (`agent/disposed`), flush and detach the session, unwind scoped listeners.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_pb2, session_pb2
from agentloop.v1 import session_event_pb2 as ev
from server import seams as S
from server.agent import Agent
from server.agent_rules import AgentCatalogue, check_id, check_persona, cwd_problem
from server.disposed import DisposedIds
from server.errors import (
    AgentDisposed,
    AgentNotFound,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    SessionDamaged,
)
from server.limits import check_capacity
from server.logs import fields
from server.loop import run_loop
from server.memory import Trimmer
from server.ownership import Ownership, Solo
from server.repair import crash_closers
from server.runtime import Runtime
from server.session import SessionLog, now_timestamp, session_message
from server.stores import Commit, InboxEntry, SessionWrites, StoreConflict
from server.system_prompt import persona_section

log = logging.getLogger(__name__)

FOLLOW_POLL = 0.5
"""Seconds a follower of a session another server drives waits for a notification
before it reads the store again anyway."""

FOLLOW_BATCH = 500

EARLIER_SESSIONS = 3
"""How many of a config agent's earlier sessions its start checks for an open turn."""

READ_CACHE = 8
"""How many stored sessions stay loaded for reading."""

Setup = Callable[[Agent], Awaitable[None]]


class AgentFactory:
    """The live agents and sessions of one server."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.agents: dict[str, Agent] = {}
        self.sessions: dict[str, SessionLog] = {}
        """Sessions with a live agent, by id."""
        self._closing = False
        self._loading: dict[str, asyncio.Lock] = {}
        self._agent_ids: set[str] = set()
        """Agent ids in use: live, being created, or being torn down (scope not yet gone)."""
        self._session_ids: set[str] = set()
        """Session ids driven by an agent that is live, being created or being torn down."""
        self._verified: dict[str, int] = {}
        """Stored sessions read whole without damage, with their event count then."""
        self._readonly: OrderedDict[str, SessionLog] = OrderedDict()
        """The latest stored sessions loaded for reading (paging through a log reuses them)."""
        self.trimmer = Trimmer()
        self.ownership: Ownership = Solo()
        """Who owns live agents: this server alone, or one replica among many."""
        self._stopping: set[asyncio.Task[None]] = set()
        self._abandoned: set[str] = set()
        """Agents stopped because another replica owns them now: never released here."""
        self.repair_on_read = True
        """Repair a crashed session's open turn when it is read (a single server)."""
        self.disposed = DisposedIds()
        """Recently disposed agent ids: calls to them are FAILED_PRECONDITION."""

    # -- create and resume -------------------------------------------------------------

    async def create(
        self,
        agent_id: str,
        options: agent_pb2.AgentOptions,
        *,
        session_id: str = "",
        cwd: str = "",
        setup: Setup | None = None,
        adopt_pending: bool = False,
    ) -> Agent:
        """Create an agent on a new session (default id `<agent_id>-session-<uuid>`).

        With `adopt_pending` (config agents, which start on a fresh session at every
        start), the messages the agent had accepted on its earlier sessions and no
        turn recorded come along and run first.
        """
        check_id("agent_id", agent_id)
        session_id = session_id or f"{agent_id}-session-{uuid.uuid4()}"
        check_id("session_id", session_id)
        if cwd_problem(cwd):
            raise InvalidArgument("metadata.cwd", cwd_problem(cwd))
        self._check_options(options)
        self._check_persona(options, cwd)
        if session_id in self._session_ids:
            raise AlreadyExists(f'session "{session_id}" already exists')
        self._reserve(agent_id, session_id)
        owned = False
        try:
            if await self.runtime.store.exists(session_id):
                raise AlreadyExists(f'session "{session_id}" already exists')
            await self.ownership.acquire(agent_id, session_id, options)
            owned = True
            header = session_pb2.SessionHeader(cwd=cwd, create_time=now_timestamp())
            session = SessionLog(
                session_id, header, self.runtime.journal, window=self.runtime.event_window
            )
            return await self._publish(
                agent_id,
                session,
                options,
                setup,
                ae.SESSION_START_SOURCE_STARTUP,
                stored=False,
                adopt_pending=adopt_pending,
            )
        except BaseException:
            self._release(agent_id, session_id)
            if owned:
                await self.ownership.release(agent_id)
            raise

    async def resume(
        self,
        agent_id: str,
        session_id: str,
        options: agent_pb2.AgentOptions | None,
        *,
        setup: Setup | None = None,
        owned: bool = False,
    ) -> Agent:
        """Create an agent over a stored session; history and numbering continue.

        `options` None restores the options the session's last agent had. `owned`: this
        server already holds the agent (a replica taking over an orphaned agent);
        otherwise it is acquired first.
        """
        check_id("agent_id", agent_id)
        check_id("session_id", session_id)
        if options is not None:
            self._check_options(options)
        if session_id in self._session_ids:
            owner = self.sessions[session_id].agent_id if session_id in self.sessions else ""
            raise FailedPrecondition(
                f'session "{session_id}" is driven by live agent "{owner}": talk to that'
                " agent, or dispose it (DisposeAgent) and resume again"
                if owner
                else f'session "{session_id}" is being taken by another agent; retry later',
                "SESSION_IN_USE",
                session_id=session_id,
                agent_id=owner,
            )
        if not self.runtime.store.persistent:
            raise FailedPrecondition(
                "cannot resume: this server keeps no persistent session store"
                " (configure store: sqlite)",
                "NOT_PERSISTENT",
            )
        self._reserve(agent_id, session_id)
        acquired = False
        try:
            if not owned:
                await self.ownership.acquire(
                    agent_id, session_id, options or agent_pb2.AgentOptions()
                )
                acquired = True
            # Claim before reading: the repair of a crash tail is written under the claim.
            fence = await self.runtime.store.claim(session_id)
            session = await self.load(session_id, fence=fence)
            if options is None:
                options = session.options or agent_pb2.AgentOptions()
                self._check_options(options)
            self._check_persona(options, session.header.cwd)
            return await self._publish(
                agent_id,
                session,
                options,
                setup,
                ae.SESSION_START_SOURCE_RESUME,
                stored=True,
                fence=fence,
            )
        except BaseException:
            self._release(agent_id, session_id)
            if acquired or owned:
                await self.ownership.release(agent_id)
            raise

    async def _publish(
        self,
        agent_id: str,
        session: SessionLog,
        options: agent_pb2.AgentOptions,
        setup: Setup | None,
        source: ae.SessionStartSource.ValueType,
        *,
        stored: bool,
        adopt_pending: bool = False,
        fence: int = 0,
    ) -> Agent:
        """Prepare privately, enter the registries, let `agent/created` veto, then start.

        The ids are reserved by the caller, so no concurrent creation can interleave.
        Any failure (setup, veto, store) rolls everything back and publishes nothing.
        A new session is stored, with the agent as its driver, in one commit before
        anything is published; a resumed one records its new driver. What the
        session's durable inbox holds runs once the driver starts.
        """
        runtime = self.runtime
        agent = Agent(agent_id, session, options, runtime)
        try:
            if options.persona:
                runtime.prompts.add_section(persona_section(options.persona), agent_id=agent_id)
            if setup is not None:
                await setup(agent)
            if self._closing:
                raise FailedPrecondition("the server is shutting down", "SHUTTING_DOWN")
            self.agents[agent_id] = agent
            self.sessions[session.session_id] = session
            session.agent_id = agent_id
            for reg in runtime.seams.listeners(S.CREATED, agent_id):
                reg.fn(agent)  # a throw here vetoes publication
            # After the veto: a vetoed creation leaves no stored session.
            writes = SessionWrites(driver=agent_id, fence=fence, options=options)
            if not stored:
                writes.create = session.header
            await runtime.store.commit(Commit({session.session_id: writes}))
            session.options = options
            # From here on, a writer that drove this session before (a paused process,
            # a replica that lost it) is fenced off: its commits are refused.
            session.fence = fence or await runtime.store.claim(session.session_id)
            adopted: list[InboxEntry] = []
            if adopt_pending:
                adopted = await runtime.store.adopt_pending(agent_id, session.session_id)
                session.adopt(adopted)
                await self._close_earlier(agent_id, session.session_id)
        except BaseException:
            self._detach(agent)
            session.agent_id = ""
            self._unwind(agent)
            raise
        agent.published = True
        agent.emit(None, (), ae.AgentEvent(created=ae.AgentCreated(session_id=session.session_id)))
        agent.emit(
            S.SESSION_START,
            (agent, source),
            ae.AgentEvent(session_start=ae.AgentSessionStart(source=source)),
        )
        agent.driver = asyncio.create_task(run_loop(agent), name=f"agent:{agent_id}")
        session.on_failure.append(lambda error: self._stop_soon(agent_id))
        pending = [session.inbox[key] for key in sorted(session.inbox)]
        if pending:
            log.info(
                "agent %s: %d pending message(s) from the store", agent_id, len(pending),
                extra=fields(agent=agent_id, session=session.session_id),
            )  # fmt: skip
            agent.restore(pending)
        return agent

    # -- lookup ------------------------------------------------------------------------

    def get(self, agent_id: str) -> Agent:
        """The live agent `agent_id`; `NotFound` otherwise.

        An agent being created or resumed is not found until it is published: nothing
        can reach its inbox while its creation still awaits the store.
        """
        check_id("agent_id", agent_id)
        agent = self.agents.get(agent_id)
        if agent is None or not agent.published:
            if agent_id in self.disposed:
                raise AgentDisposed(agent_id)
            raise AgentNotFound(agent_id)
        return agent

    def list_agents(self) -> list[Agent]:
        """Every live (published) agent, by id."""
        return [self.agents[key] for key in sorted(self.agents) if self.agents[key].published]

    async def session(self, session_id: str) -> SessionLog:
        """A live session, or a stored one loaded read-only (kept while it is unchanged)."""
        check_id("session_id", session_id)
        live = self.sessions.get(session_id)
        if live is not None:
            return live
        cached = self._readonly.get(session_id)
        if cached is not None:
            summary = await self.runtime.store.summary(session_id)
            if summary.event_count == len(cached):
                self._readonly.move_to_end(session_id)
                return cached
        loaded = await self.load(session_id)
        self._readonly[session_id] = loaded
        if len(self._readonly) > READ_CACHE:
            self._readonly.popitem(last=False)
        return loaded

    async def load(self, session_id: str, *, fence: int = 0) -> SessionLog:
        """Load a stored session, closing (durably) a turn that a crash left open.

        Only a server that may drive the session repairs it: one that claimed it
        (`fence`, resuming it), or a single server reading a session nobody drives
        (`repair_on_read`). A replica merely reading a session shows its stored log as
        it is: the open turn may be another replica's running turn.

        Loads of one session are serialised, so that concurrent readers of a crashed
        session store its repair once and all see the repaired log.
        """
        store = self.runtime.store
        lock = self._loading.setdefault(session_id, asyncio.Lock())
        try:
            async with lock:
                stored = await store.load(session_id)
                repair = bool(fence) or self.repair_on_read
                closers = crash_closers(stored.events) if repair else []
                if closers:
                    log.warning(
                        "session %s: closing turn %d interrupted by a crash",
                        session_id,
                        closers[-1].turn_end.turn,
                        extra=fields(session=session_id, turn=closers[-1].turn_end.turn),
                    )
                    writes = SessionWrites(events=closers, fence=fence)
                    await store.commit(Commit({session_id: writes}))
        finally:
            if not lock.locked() and self._loading.get(session_id) is lock:
                del self._loading[session_id]
        self._verified[session_id] = len(stored.events) + len(closers)
        return SessionLog(
            session_id,
            stored.header,
            self.runtime.journal,
            seed=[*stored.events, *closers],
            inbox=stored.inbox,
            window=self.runtime.event_window,
            options=stored.options,
        )

    async def _close_earlier(self, agent_id: str, session_id: str) -> None:
        """Repair the agent's recent earlier sessions a crash left open (a config agent).

        They are the agent's: nobody else drives them (it holds the agent), so the
        repair is written under a claim. Balanced ones (their last event is a
        `turn_end`) are not read.
        """
        store = self.runtime.store
        for earlier in (await store.driven_by(agent_id))[:EARLIER_SESSIONS]:
            if earlier == session_id or earlier in self.sessions:
                continue
            count = (await store.summary(earlier)).event_count
            last = await store.read(earlier, count - 1, count) if count else []
            if last and not last[0].HasField("turn_end"):
                await self.load(earlier, fence=await store.claim(earlier))

    async def follow_stored(
        self, session_id: str, cursor: int, max_bytes: int
    ) -> AsyncIterator[list[ev.SessionEvent]]:
        """Batches of a session another server drives, read from the store as they land.

        The store is the truth: polled, so nothing is missed or repeated whichever
        server writes; it ends once nobody drives the session and all was read.
        """
        store = self.runtime.store
        while True:
            events = await store.read(session_id, cursor, cursor + FOLLOW_BATCH)
            batch: list[ev.SessionEvent] = []
            size = 0
            for event in events:
                size += event.ByteSize()
                if batch and size > max_bytes:
                    break
                batch.append(event)
            if batch:
                cursor += len(batch)
                yield batch
                continue
            driven = session_id in self.sessions  # taken over here meanwhile: still coming
            if not driven and not await self.ownership.still_driven(session_id):
                return
            await store.wait_for_events(session_id, FOLLOW_POLL)

    async def session_ids(self) -> list[str]:
        """Every session id, stored or live, sorted."""
        return sorted(set(await self.runtime.store.list_ids()) | set(self.sessions))

    async def describe(self, session_id: str) -> session_pb2.Session:
        """The `Session` resource of a live or stored session.

        A stored session is read whole once (and again when it grew since), so that a
        damaged one is reported with its `load_error`, and a crash tail is repaired,
        before anyone resumes it; after that its stored counts are enough.
        """
        live = self.sessions.get(session_id)
        if live is not None:
            return session_message(live)
        try:
            summary = await self.runtime.store.summary(session_id)
            if self._verified.get(session_id) != summary.event_count:
                return session_message(await self.load(session_id))
        except SessionDamaged as error:
            return session_pb2.Session(session_id=session_id, load_error=str(error))
        return session_pb2.Session(
            session_id=session_id,
            header=summary.header,
            event_count=summary.event_count,
            turn_count=summary.turn_count,
            pending_messages=summary.pending,
        )

    async def fork(
        self, session_id: str, boundary_seq: int | None, new_session_id: str = ""
    ) -> session_pb2.Session:
        """Store a new session seeded with `session_id`'s events up to a `turn_end`.

        The copy is one transaction of the store: after a crash the fork is absent
        or complete. Only stored events can be forked.
        """
        live = self.sessions.get(session_id)
        source = live if live is not None else await self.session(session_id)  # repairs
        new_session_id = new_session_id or f"{session_id}-fork-{uuid.uuid4()}"
        check_id("new_session_id", new_session_id)
        if new_session_id in self.sessions or new_session_id in self._session_ids:
            raise AlreadyExists(f'session "{new_session_id}" already exists')
        header = session_pb2.SessionHeader(
            cwd=source.header.cwd, parent_session_id=session_id, create_time=now_timestamp()
        )
        await self.runtime.store.fork(session_id, boundary_seq, new_session_id, header)
        return await self.describe(new_session_id)

    # -- teardown ----------------------------------------------------------------------

    async def dispose(self, agent_id: str) -> Agent:
        """Dispose a live agent in the documented teardown order."""
        agent = self.get(agent_id)
        await self.teardown(agent)
        return agent

    async def teardown(self, agent: Agent) -> None:
        """Stop, drain, detach the agent, flush and detach the session, unwind the scope.

        Memoised per agent and shielded: concurrent or cancelled callers all wait for the
        one teardown, which always runs to its end.
        """
        if agent.teardown is None:
            agent.teardown = asyncio.ensure_future(self._teardown(agent))
        await asyncio.shield(agent.teardown)

    async def _teardown(self, agent: Agent) -> None:
        agent.stop()
        if agent.driver is not None:
            await asyncio.wait([agent.driver])  # its failure, if any, was logged by the loop
        if agent.pending_flushes:
            await asyncio.gather(*agent.pending_flushes, return_exceptions=True)
        if self.agents.get(agent.agent_id) is agent:
            del self.agents[agent.agent_id]
            self.disposed.add(agent.agent_id)
            agent.emit(S.DISPOSED, (agent,), ae.AgentEvent(disposed=ae.AgentDisposed()))
        try:
            await self.runtime.persistence.flush(agent.session)
        except Exception as error:
            agent.report_error(agent.session.max_turn, 0, error)
        self._detach(agent)
        self._unwind(agent)
        self.runtime.models.release(agent.agent_id)
        abandoned = agent.agent_id in self._abandoned
        self._abandoned.discard(agent.agent_id)
        if not self._closing and not abandoned:  # a stopping server hands over instead
            try:
                await self.ownership.release(agent.agent_id)
            except Exception:
                log.warning("agent %s: giving up its ownership failed", agent.agent_id)
        self._release(agent.agent_id, agent.session.session_id)
        agent.session.wake_waiters()
        self.trimmer.soon()  # what the agent held is free now: give it back

    def _stop_soon(self, agent_id: str) -> None:
        """The store refused the agent's session: stop the agent (it writes nothing more)."""
        task = asyncio.ensure_future(self.abandon(agent_id))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def abandon(self, agent_id: str) -> None:
        """Stop an agent whose ownership moved elsewhere, writing nothing more."""
        agent = self.agents.get(agent_id)
        if agent is None or agent_id in self._abandoned:
            return
        self._abandoned.add(agent_id)
        agent.session.fail(StoreConflict(f'agent "{agent_id}" is owned by another writer now'))
        log.warning("agent %s stopped: %s", agent_id, agent.session.failure)
        await self.teardown(agent)

    async def close(self) -> None:
        """Dispose every agent (server shutdown): running turns end `disposed`.

        Queued messages stay in the durable inbox: they run when the session is
        resumed (or, for config agents, when the server starts again).
        """
        self._closing = True
        await asyncio.gather(*(self.teardown(a) for a in list(self.agents.values())))
        await asyncio.gather(*self._stopping, return_exceptions=True)
        await self.runtime.journal.drain()
        await self.trimmer.close()

    def _reserve(self, agent_id: str, session_id: str) -> None:
        """Claim both ids at once, before any await, so a same-id race has one winner."""
        if self._closing:
            raise FailedPrecondition("the server is shutting down", "SHUTTING_DOWN")
        if agent_id in self._agent_ids:
            raise AlreadyExists(f'agent "{agent_id}" already exists')
        check_capacity(self.runtime.limits, "max_agents", len(self._agent_ids), "agents")
        self._agent_ids.add(agent_id)
        self._session_ids.add(session_id)
        self.disposed.discard(agent_id)

    def _release(self, agent_id: str, session_id: str) -> None:
        self._agent_ids.discard(agent_id)
        self._session_ids.discard(session_id)

    def _detach(self, agent: Agent) -> None:
        if self.agents.get(agent.agent_id) is agent:
            del self.agents[agent.agent_id]
        if self.sessions.get(agent.session.session_id) is agent.session:
            del self.sessions[agent.session.session_id]

    def _unwind(self, agent: Agent) -> None:
        self.runtime.seams.remove_agent(agent.agent_id)
        self.runtime.prompts.remove_agent(agent.agent_id)
        self.runtime.tools.remove_agent(agent.agent_id)

    def _check_options(self, options: agent_pb2.AgentOptions) -> None:
        """The one check of agent options (`server/agent_rules.py`), against the registry."""
        models = self.runtime.models
        catalogue = AgentCatalogue(
            models.names(), self.runtime.tools.names(), self.runtime.default_provider,
            self.runtime.limits,
        )  # fmt: skip
        provider = catalogue.provider_of(options)
        known = provider in catalogue.providers  # else `check` refuses it
        catalogue.check(options, getattr(models.get(provider), "options_type", "") if known else "")

    def _check_persona(self, options: agent_pb2.AgentOptions, cwd: str) -> None:
        provider = options.provider or self.runtime.default_provider
        model = options.model or self.runtime.models.default_model(provider)
        check_persona(options, provider, model, cwd)
