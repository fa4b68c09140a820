"""The agent lifecycle: creation and resume as one rollback-covered transaction, teardown.

Reading sessions (listing, describing, following, forking stored ones) is the session
catalogue's (`server/sessions/catalogue.py`), which this factory owns as `catalogue`.

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
import time
import uuid
from collections.abc import Awaitable, Callable

from agentloop.v1 import agent_event_pb2 as ae
from agentloop.v1 import agent_factory_service_pb2 as fac
from agentloop.v1 import agent_pb2, session_pb2
from server.cluster.ownership import Ownership, Solo
from server.kernel import seams as S
from server.kernel.errors import (
    AgentDisposed,
    AgentNotFound,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from server.kernel.ids import check_id
from server.kernel.limits import check_capacity
from server.lifecycle.disposed import DisposedIds
from server.lifecycle.lineage import Family, Link
from server.loop.agent import Agent
from server.loop.approvals import check_approval_options
from server.loop.driver import run_loop
from server.loop.runtime import Runtime
from server.loop.system_prompt import persona_section
from server.memory import Trimmer
from server.observability.logs import fields
from server.sessions.catalogue import SessionCatalogue
from server.sessions.session import SessionLog, now_timestamp
from server.settings.agent_rules import AgentCatalogue, check_persona, cwd_problem
from server.stores import InboxEntry, SessionWrites, StoreConflict

log = logging.getLogger(__name__)

Setup = Callable[[Agent], Awaitable[None]]


class AgentFactory:
    """The live agents of one server: created, resumed, disposed, torn down."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.agents: dict[str, Agent] = {}
        self.sessions: dict[str, SessionLog] = {}
        """Sessions with a live agent, by id."""
        self._closing = False
        self._agent_ids: set[str] = set()
        """Agent ids in use: live, being created, or being torn down (scope not yet gone)."""
        self._session_ids: set[str] = set()
        """Session ids driven by an agent that is live, being created or being torn down."""
        self.trimmer = Trimmer()
        self.ownership: Ownership = Solo()
        """Who owns live agents: this server alone, or one replica among many."""
        self._stopping: set[asyncio.Task[None]] = set()
        self._abandoned: set[str] = set()
        """Agents stopped because another replica owns them now: never released here."""
        self._handing: set[str] = set()
        """Agents being handed to another replica: their calls are routed by the lease."""
        self.moved = DisposedIds()
        """Recently handed-over agent ids: a stream of one ends `AGENT_MOVING`, not done."""
        self.disposed = DisposedIds()
        """Recently disposed agent ids: calls to them are FAILED_PRECONDITION."""
        self.family = Family()
        """Which live agent owns which: children are torn down before their owner."""
        self.catalogue = SessionCatalogue(
            runtime.store,
            runtime.journal,
            runtime.event_window,
            live=self.sessions,
            reserved=self._session_ids,
            still_driven=lambda session_id: self.ownership.still_driven(session_id),
        )
        """The sessions of this server, live and stored, for reading."""

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
        parent: fac.AgentParent | None = None,
        seed: fac.SessionSeed | None = None,
    ) -> Agent:
        """Create an agent on a new session (default id `<agent_id>-session-<uuid>`).

        With `adopt_pending` (config agents, which start on a fresh session at every
        start), the messages the agent had accepted on its earlier sessions and no
        turn recorded come along and run first. With `parent` the agent is that live
        agent's child (`lineage.py`); with `seed` its session starts as a fork of the
        seed session's prefix.
        """
        check_id("agent_id", agent_id)
        session_id = session_id or f"{agent_id}-session-{uuid.uuid4()}"
        check_id("session_id", session_id)
        if cwd_problem(cwd):
            raise InvalidArgument("metadata.cwd", cwd_problem(cwd))
        self._check_options(options)
        self._check_persona(options, cwd)
        link = self._admit(parent) if parent is not None and parent.agent_id else None
        if session_id in self._session_ids:
            raise AlreadyExists(f'session "{session_id}" already exists')
        self._reserve(agent_id, session_id)
        if link is not None:  # no await since `_admit`: the fan-out check holds
            self.family.add(agent_id, link)
        owned = False
        try:
            if await self.runtime.store.exists(session_id):
                raise AlreadyExists(f'session "{session_id}" already exists')
            await self.ownership.acquire(agent_id, session_id, options)
            owned = True
            header = session_pb2.SessionHeader(cwd=cwd, create_time=now_timestamp())
            if link is not None:
                header.parent_agent_id = link.parent
                header.parent_tool_call_id = link.tool_call_id
            fence = 0
            if seed is not None and seed.session_id:
                fence = await self._seed(session_id, seed, header)
                session = await self.catalogue.load(session_id, fence=fence)
            else:
                session = SessionLog(
                    session_id, header, self.runtime.journal, window=self.runtime.event_window
                )
            agent = await self._publish(
                agent_id,
                session,
                options,
                setup,
                ae.SESSION_START_SOURCE_STARTUP,
                stored=bool(fence),
                adopt_pending=adopt_pending,
                fence=fence,
            )
        except BaseException:
            self._release(agent_id, session_id)
            self.family.remove(agent_id)
            if owned:
                await self.ownership.release(agent_id)
            raise
        if link is not None:
            await self._check_owner(agent, link)
        return agent

    def _admit(self, parent: fac.AgentParent) -> Link:
        """The link of a child of `parent`, which must be live and not being torn down."""
        check_id("parent.agent_id", parent.agent_id)
        owner = self.agents.get(parent.agent_id)
        if owner is None or not owner.published or owner.teardown is not None:
            raise NotFound(
                f'parent.agent_id: agent "{parent.agent_id}" is not live',
                "AGENT_NOT_FOUND",
                agent_id=parent.agent_id,
                field="parent.agent_id",
            )
        turn = owner.loop.turn.number if owner.loop.turn is not None else 0
        return self.family.admit(self.runtime.limits, parent.agent_id, parent.tool_call_id, turn)

    async def _seed(
        self, session_id: str, seed: fac.SessionSeed, header: session_pb2.SessionHeader
    ) -> int:
        """Store the new session as a fork of the seed's prefix; the claim's fence."""
        check_id("seed.session_id", seed.session_id)
        if seed.session_id not in self.sessions and not await self.runtime.store.exists(
            seed.session_id
        ):
            raise NotFound(
                f'seed.session_id: session "{seed.session_id}" not found',
                "SESSION_NOT_FOUND",
                session_id=seed.session_id,
                field="seed.session_id",
            )
        source = await self.catalogue.session(seed.session_id)  # repairs a crash tail
        header.cwd = header.cwd or source.header.cwd
        header.parent_session_id = seed.session_id
        boundary = seed.seq if seed.HasField("seq") else None
        try:
            await self.runtime.store.fork(seed.session_id, boundary, session_id, header)
        except InvalidArgument as error:
            raise InvalidArgument("seed.seq", error.problem) from None
        return await self.runtime.store.claim(session_id)

    async def _check_owner(self, child: Agent, link: Link) -> None:
        """Undo a published child whose parent left while it was created."""
        owner = self.agents.get(link.parent)
        if owner is None or owner.teardown is not None:
            await self.teardown(child)
            raise FailedPrecondition(
                f'agent "{link.parent}" was disposed while its child was created',
                "AGENT_DISPOSED",
                agent_id=link.parent,
            )

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
            session = await self.catalogue.load(session_id, fence=fence)
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
            await runtime.journal.write_now(session.session_id, writes)
            session.options = options
            # From here on, a writer that drove this session before (a paused process,
            # a replica that lost it) is fenced off: its commits are refused.
            session.fence = fence or await runtime.store.claim(session.session_id)
            if session.failure is not None:  # lost to another replica meanwhile (`lose`)
                raise session.failure
            # Stored and claimed: a replica that took the agent over now resumes it. One
            # that found no session yet (this creation stalled past its lease) gave the
            # lease up: hold it again, or no other replica would route to the agent.
            await self.ownership.confirm(agent_id, session.session_id, options)
            adopted: list[InboxEntry] = []
            if adopt_pending:
                adopted = await runtime.store.adopt_pending(agent_id, session.session_id)
                session.adopt(adopted)
                await self.catalogue.close_earlier(agent_id, session.session_id)
        except BaseException:
            self._detach(agent)
            session.agent_id = ""
            self._unwind(agent)
            raise
        agent.published = True
        created = ae.AgentEvent(created=ae.AgentCreated(session_id=session.session_id))
        agent.emit(None, None, created)
        agent.emit(
            S.SESSION_START,
            S.SessionStarted(agent, source),
            ae.AgentEvent(session_start=ae.AgentSessionStart(source=source)),
        )
        agent.driver = agent.tasks.start(run_loop(agent), name=f"agent:{agent_id}")
        session.on_failure.append(lambda error: self._stop_soon(agent_id))
        pending = session.inbox.pending()
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

    def serves(self, agent_id: str) -> bool:
        """Whether calls for `agent_id` are answered by this server's live agent.

        Not while it is being created or resumed, nor once it was abandoned to another owner.
        """
        agent = self.agents.get(agent_id)
        return (
            agent is not None
            and agent.published
            and agent_id not in self._abandoned
            and agent_id not in self._handing
        )

    def cancel(self, agent: Agent, reason: str = "") -> tuple[bool, int]:
        """Cancel the agent's running turn, and the children that turn made (their trees).

        Returns what `Agent.cancel` returns for the agent itself.
        """
        turn = agent.loop.turn.number if agent.loop.turn is not None else 0
        for child in self.family.started_by(agent.agent_id, turn) if turn else []:
            if child in self.agents:
                self.cancel(self.agents[child], reason or "parent turn cancelled")
        return agent.cancel(reason)

    def held(self) -> set[str]:
        """The agents this server holds: live, being created, resumed or disposed.

        Not those it abandoned to another owner.
        """
        return self._agent_ids - self._abandoned

    def movable(self) -> list[str]:
        """The live agents that may move to another replica, those between turns first.

        Not an agent with a parent or children here: a child lives on its parent's
        replica, and a family moves only by failover (the child is retired).
        """
        family = self.family
        agents = [
            agent
            for agent in self.list_agents()
            if agent.teardown is None
            and self.serves(agent.agent_id)
            and family.link(agent.agent_id) is None
            and not family.children(agent.agent_id)
        ]
        return [agent.agent_id for agent in sorted(agents, key=lambda a: not a.is_idle())]

    async def hand_off(self, agent_id: str, wait: float) -> bool:
        """Close a live agent between two turns, for another replica to resume it.

        From now on its calls are routed by its lease (`AGENT_MOVING` until its next
        owner runs it); what it has queued runs first. Once it is idle it stops at once
        (no turn can start in between) and is torn down without giving up its
        ownership or its session. False, and it serves again, when it is not idle
        within `wait` seconds.
        """
        agent = self.agents.get(agent_id)
        if agent is None or not self.serves(agent_id) or agent.teardown is not None:
            return False
        self._handing.add(agent_id)
        try:
            try:
                await asyncio.wait_for(agent.when_idle(), wait)
            except TimeoutError:
                return False
            if not agent.is_idle() or agent.teardown is not None or agent.disposed:
                return False
            self._abandoned.add(agent_id)  # kept, not released: its lease goes on
            self.moved.add(agent_id)
            agent.stop()
        finally:
            self._handing.discard(agent_id)
        await self.teardown(agent)
        return True

    def list_agents(self) -> list[Agent]:
        """Every live (published) agent, by id."""
        return [self.agents[key] for key in sorted(self.agents) if self.agents[key].published]

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
        # Stopped before its children: a child's end must not let its turn run on and
        # complete (a `delegate` answered by a disposed child) before the stop lands.
        agent.stop()  # its turn ends `disposed`, its driver returns
        for child in reversed(self.family.children(agent.agent_id)):  # depth first, newest first
            if child in self.agents:
                await self.teardown(self.agents[child])
        if agent.driver is not None:
            await asyncio.wait([agent.driver])  # its failure, if any, was logged by the loop
        if agent.pending_flushes:
            await asyncio.gather(*agent.pending_flushes, return_exceptions=True)
        await agent.tasks.close()  # what the agent still runs (an approver's ask) ends here
        if self.agents.get(agent.agent_id) is agent:
            del self.agents[agent.agent_id]
            self.disposed.add(agent.agent_id)  # replicas route its calls by lease first
            agent.emit(S.DISPOSED, agent, ae.AgentEvent(disposed=ae.AgentDisposed()))
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
            await self._record_disposal(agent)
            try:
                await self.ownership.release(agent.agent_id)
            except Exception:
                log.warning("agent %s: giving up its ownership failed", agent.agent_id)
        self._release(agent.agent_id, agent.session.session_id)
        self.family.remove(agent.agent_id)
        agent.session.wake_waiters()
        self.trimmer.soon()  # what the agent held is free now: give it back

    async def _record_disposal(self, agent: Agent) -> None:
        """Mark the session disposed now, for the retention rule on disposed agents' sessions.

        Before the ownership goes: no other replica has resumed the session yet.
        """
        session = agent.session
        if session.failure is not None:  # the store refused it: write nothing more
            return
        try:
            await self.runtime.store.mark_disposed(session.session_id, time.time_ns())
        except Exception as error:
            log.warning("agent %s: recording its disposal failed: %s", agent.agent_id, error)

    def _stop_soon(self, agent_id: str) -> None:
        """The store refused the agent's session: stop the agent (it writes nothing more)."""
        task = asyncio.ensure_future(self.abandon(agent_id))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def lose(self, agent_id: str) -> None:
        """Stop acting for an agent whose ownership moved elsewhere, at once (no await).

        From here on its calls are routed by its lease, its session writes nothing
        (failed) and its turn is cancelled; `abandon` then tears it down.
        """
        agent = self.agents.get(agent_id)
        if agent is None or agent_id in self._abandoned:
            return
        self._abandoned.add(agent_id)
        agent.session.fail(StoreConflict(f'agent "{agent_id}" is owned by another writer now'))
        log.warning("agent %s stopped: %s", agent_id, agent.session.failure)
        agent.stop()

    async def abandon(self, agent_id: str) -> None:
        """Stop an agent whose ownership moved elsewhere (`lose`), and tear it down."""
        self.lose(agent_id)
        agent = self.agents.get(agent_id)
        if agent is not None and agent_id in self._abandoned:
            await self.teardown(agent)

    async def close(self) -> None:
        """Dispose every agent (server shutdown): running turns end `disposed`.

        Queued messages stay in the durable inbox: they run when the session is
        resumed (or, for config agents, when the server starts again). An agent that
        does not end its turn is stopped by `cancel_all`.
        """
        self._closing = True
        await asyncio.gather(*(self.teardown(a) for a in list(self.agents.values())))
        await asyncio.gather(*self._stopping, return_exceptions=True)
        await self.runtime.journal.drain()
        await self.trimmer.close()

    def cancel_all(self) -> int:
        """Cancel the task group of every agent not torn down yet; returns how many.

        For a shutdown past its grace: the drivers stop where they are (their turns
        are not closed; a reload closes them `interrupted`), and the teardowns that
        waited for them go on.
        """
        running = list(self.agents.values())
        for agent in running:
            agent.tasks.cancel()
        return len(running)

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
        self.moved.discard(agent_id)

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
        """The one check of agent options (`settings/agent_rules.py`), against the registry."""
        models = self.runtime.models
        catalogue = AgentCatalogue(
            models.names(), self.runtime.tools.enableable(), self.runtime.default_provider,
            self.runtime.limits,
        )  # fmt: skip
        provider = catalogue.provider_of(options)
        known = provider in catalogue.providers  # else `check` refuses it
        catalogue.check(options, getattr(models.get(provider), "options_type", "") if known else "")
        check_approval_options(options)
        for name, profile in sorted(options.subagent_profiles.items()):
            try:
                self._check_options(profile)
            except InvalidArgument as error:  # named where it is: inside the profile
                inner = error.field.removeprefix("options.")
                field = f"options.subagent_profiles[{name}].{inner}"
                raise InvalidArgument(field, error.problem) from None

    def _check_persona(self, options: agent_pb2.AgentOptions, cwd: str) -> None:
        provider = options.provider or self.runtime.default_provider
        model = options.model or self.runtime.models.default_model(provider)
        check_persona(options, provider, model, cwd)
