"""The Orchestrator: sessions, who owns them, and the python_repl operations on them.

Invariants: a session id is visible only to its tenant, and an unknown id and another tenant's id
raise the same ``SessionNotFoundError``; a session is created whole (container and ready worker)
or not at all; ``aclose`` removes every container this orchestrator created, shielded and bounded.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from orchestrator.arguments import (
    check_code,
    check_max_tokens,
    check_policy_name,
    check_session_id,
    check_timeout,
    check_variable,
)
from orchestrator.audit import AuditLog
from orchestrator.backend.base import LABEL_ORCHESTRATOR, ContainerSpec
from orchestrator.backend.docker import DockerBackend
from orchestrator.config import OrchestratorConfig as OrchestratorConfig  # re-exported
from orchestrator.errors import (
    BackendError,
    BusyError,
    InvalidArgumentError,
    OrchestratorError,
    QuotaExceededError,
    SessionNotFoundError,
)
from orchestrator.files import SessionFiles
from orchestrator.history import CodeHistory
from orchestrator.lifecycle import (
    EndedSessions,
    eviction_candidate,
    expiry_reason,
    reap_interval,
    should_pause,
)
from orchestrator.policy import Policy, load_policy
from orchestrator.pool import WarmPool
from orchestrator.processes import SessionProcesses
from orchestrator.protocol import InspectReply, ListVariablesReply
from orchestrator.repl import ExecuteOutcome, Repl
from orchestrator.sessions import Session, new_session_id
from orchestrator.shell import PersistentShell
from orchestrator.terminal import SessionTerminals
from orchestrator.tools import TOOLS, ToolResult, call_tool

log = logging.getLogger(__name__)

# Pooled sessions carry this tenant label: labels are fixed at creation, owners come later.
POOL_TENANT = "pool"
MAX_POOL_SIZE = 256

# Teardown of one session is a SIGKILL and a container removal; a whole shutdown gets this long.
SHUTDOWN_TIMEOUT = 60.0


class ExecuteResult(ExecuteOutcome):
    session_id: str
    created_new_session: bool


class Orchestrator:
    def __init__(
        self, config: OrchestratorConfig | None = None, *, backend: DockerBackend | None = None
    ) -> None:
        self.config = config or OrchestratorConfig()
        self.backend = backend or DockerBackend()
        self._image = self.config.image
        self._sessions: dict[str, Session] = {}
        self._creating = 0
        self._policies: dict[str, Policy] = {}
        self._items: dict[tuple[str, str], str] = {}
        self._ended = EndedSessions()
        self._pools: dict[str, WarmPool] = {}
        self._audit: AuditLog | None = None
        self._exit_stack = contextlib.AsyncExitStack()
        self._task_group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Check the engine, load the default policy, make sure the image exists, and open the
        task group that owns every session's background tasks (terminal output pumps).

        Call ``start`` and ``aclose`` from the same task (``async with`` does)."""
        await self.backend.client.ping()
        self.policy(self.config.default_policy)
        if self.config.audit_dir is not None:
            self._audit = await AuditLog.open(self.config.audit_dir, self.config.audit)
        if self._image is None:
            from orchestrator.images import ensure_worker_image

            self._image = (await ensure_worker_image(self.backend.client)).tag
        self._task_group = await self._exit_stack.enter_async_context(anyio.create_task_group())
        self._task_group.start_soon(self._reap_forever)
        for name, size in self.config.pool.items():
            await self.set_pool_size(name, size)

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.resize(0)
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_TIMEOUT):
            sessions, self._sessions = list(self._sessions.values()), {}
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    tg.start_soon(session.aclose, self.backend)
        if self._task_group is not None:
            # Cancelling ends the pools' refill tasks, which remove what they still hold.
            self._task_group.cancel_scope.cancel()
            self._task_group = None
        self._pools.clear()
        if self._audit is not None:
            await self._audit.aclose()
            self._audit = None
        # Outside the scopes above: the task group must be exited as the innermost scope.
        await self._exit_stack.aclose()

    def policy(self, name: str | None) -> Policy:
        name = name or self.config.default_policy
        if name not in self._policies:
            self._policies[name] = load_policy(name, search_dirs=self.config.policy_dirs)
        return self._policies[name]

    async def call(self, tool: Any, arguments: Any, *, tenant: str | None = None) -> ToolResult:
        """One tool call as every interface makes it: ``{operation, ...}`` in, a result out.
        Every call, refused ones included, goes into the audit log when one is kept."""
        started = time.perf_counter()
        found = TOOLS.get(tool) if isinstance(tool, str) else None
        if found is None:
            error = InvalidArgumentError(f"tool must be one of: {', '.join(TOOLS)}")
            result = ToolResult({"success": False, **error.to_dict()}, str(error))
        else:
            result = await call_tool(self, found, arguments, tenant=tenant)
        if self._audit is not None:
            await self._audit_call(tool, arguments, tenant, result, time.perf_counter() - started)
        return result

    async def _audit_call(
        self, tool: Any, arguments: Any, tenant: str | None, result: ToolResult, seconds: float
    ) -> None:
        assert self._audit is not None
        structured = result.structured
        args = arguments if isinstance(arguments, dict) else {"arguments": repr(arguments)[:200]}
        session_id = structured.get("session_id") or args.get("session_id")
        try:
            await self._audit.record(
                tenant=tenant or self.config.tenant,
                task=None,
                tool=str(tool)[:64],
                operation=str(structured.get("operation"))[:64],
                session_id=session_id if isinstance(session_id, str) else None,
                arguments=args,
                success=bool(structured.get("success")),
                error_type=structured.get("error_type"),
                duration_ms=round(seconds * 1000, 3),
            )
        except OrchestratorError as exc:
            # The call has happened; refusing its answer now would not undo it. Say it loudly.
            log.error(
                "audit log could not record %s.%s: %s", tool, structured.get("operation"), exc
            )

    # -- sessions -------------------------------------------------------------------------

    async def create_session(
        self, *, policy: str | None = None, tenant: str | None = None
    ) -> Session:
        tenant = tenant or self.config.tenant
        effective = self.policy(policy)
        await self._make_room()
        self._reserve(tenant, effective)
        try:
            return await self._build_session(tenant, effective)
        finally:
            self._creating -= 1

    async def _make_room(self) -> None:
        """At ``max_sessions``, end the least recently active idle session (seed 000's rule)."""
        if len(self._sessions) + self._creating < self.config.max_sessions:
            return
        victim = eviction_candidate(self._sessions.values())
        if victim is not None:
            await self.end_session(victim, "evicted: the orchestrator is at max_sessions")

    def _reserve(self, tenant: str, policy: Policy) -> None:
        if len(self._sessions) + self._creating >= self.config.max_sessions:
            raise QuotaExceededError(
                f"max_sessions: {self.config.max_sessions} sessions exist and all are busy"
            )
        owned = sum(1 for s in self._sessions.values() if s.tenant == tenant)
        if owned >= policy.limits.max_sessions_per_owner:
            limit = policy.limits.max_sessions_per_owner
            raise QuotaExceededError(f"max_sessions_per_owner: {limit} sessions already open")
        self._creating += 1

    async def _build_session(self, tenant: str, policy: Policy) -> Session:
        pool = self._pools.get(policy.name)
        warm = pool.take_nowait() if pool is not None and pool.policy == policy else None
        if warm is not None:
            warm.tenant = tenant
            warm.touch()
            session = warm
        else:
            session = await self._new_session(tenant, policy)
        self._sessions[session.id] = session
        return session

    async def _new_session(self, tenant: str, policy: Policy) -> Session:
        """A session built cold: its container created and started, its worker ready."""
        task_group = self._task_group
        if self._image is None or task_group is None:
            raise RuntimeError("start() the orchestrator (or use it as `async with`) first")
        session_id = new_session_id()
        spec = ContainerSpec(
            image=self._image,
            policy=policy,
            session_id=session_id,
            tenant=tenant,
            orchestrator_id=self.config.orchestrator_id,
            extra_labels=self.config.extra_labels,
        )
        container_id = await self.backend.create_container(spec)
        session = Session(
            id=session_id,
            tenant=tenant,
            policy=policy,
            container_id=container_id,
            repl=Repl(self.backend, container_id, policy),
            files=SessionFiles(self.backend, container_id, policy),
            processes=SessionProcesses(self.backend, container_id, policy),
            terminals=SessionTerminals(self.backend, container_id, policy),
            shell=PersistentShell(self.backend, container_id, policy),
            history=CodeHistory(policy.python.max_history),
        )
        try:
            await session.repl.start()
            await task_group.start(session.terminals.serve)
        except BaseException:
            await session.aclose(self.backend)  # shielded: the container never outlives this
            raise
        return session

    # -- warm pools -----------------------------------------------------------------------

    async def set_pool_size(self, policy: str, size: int) -> None:
        """Keep ``size`` ready sessions of ``policy`` (0 drains and stops the pool)."""
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_POOL_SIZE:
            raise InvalidArgumentError(f"pool size must be an integer in [0, {MAX_POOL_SIZE}]")
        effective = self.policy(check_policy_name(policy))
        pool = self._pools.get(effective.name)
        if pool is not None:
            pool.resize(size)
            return
        if size == 0:
            return
        if self._task_group is None:
            raise RuntimeError("start() the orchestrator (or use it as `async with`) first")
        pool = WarmPool(
            effective,
            size,
            build=lambda: self._new_session(POOL_TENANT, effective),
            discard=self._discard_pooled,
        )
        self._pools[effective.name] = pool
        await self._task_group.start(pool.run)

    def pool_status(self) -> dict[str, dict[str, int]]:
        return {name: {"size": p.size, "ready": p.ready} for name, p in self._pools.items()}

    async def _discard_pooled(self, session: Session, reason: str) -> None:
        log.info("pooled session %s removed: %s", session.id, reason)
        await session.aclose(self.backend)

    async def session(self, session_id: Any, *, tenant: str | None = None) -> Session:
        """The caller's session, ready for work (resumed if it was paused)."""
        session = self.find_session(session_id, tenant=tenant)
        if session.paused:
            await self._thaw(session)
        return session

    def find_session(self, session_id: Any, *, tenant: str | None = None) -> Session:
        """The caller's session as it is; unknown and not-yours are indistinguishable. Its owner
        is told why a session that ended on its own (idle, lifetime, eviction) is gone."""
        check_session_id(session_id)
        tenant = tenant or self.config.tenant
        session = self._sessions.get(session_id)
        if session is None or session.tenant != tenant:
            ended = self._ended.reason(tenant, session_id)
            suffix = f" (it ended: {ended})" if ended else ""
            raise SessionNotFoundError(f"session not found: {session_id}{suffix}")
        session.touch()
        return session

    async def open_session(
        self, session_id: Any, *, policy: Any = None, tenant: str | None = None
    ) -> tuple[Session, bool]:
        """The caller's session, or a new one when ``session_id`` is None; says which."""
        if session_id is None:
            return await self.create_session(policy=check_policy_name(policy), tenant=tenant), True
        if policy is not None:
            raise InvalidArgumentError("policy applies only when a new session is created")
        return await self.session(session_id, tenant=tenant), False

    def remember(self, kind: str, item_id: str, session: Session) -> None:
        """Index an id made inside a session (a process, a terminal) for lookups by id alone."""
        self._items[(kind, item_id)] = session.id

    async def session_of(self, kind: str, item_id: Any, *, tenant: str | None = None) -> Session:
        """The caller's session holding ``item_id``; unknown and not-yours answer alike."""
        if not isinstance(item_id, str) or not 0 < len(item_id) <= 128:
            raise InvalidArgumentError(f"{kind}_id must be a string of 1 to 128 characters")
        session_id = self._items.get((kind, item_id))
        try:
            session = self.find_session(session_id or "-", tenant=tenant)
        except SessionNotFoundError:
            raise SessionNotFoundError(f"{kind} not found: {item_id}") from None
        return await self.session(session.id, tenant=tenant)

    # -- pause and resume -----------------------------------------------------------------

    async def pause(self, session_id: Any, *, tenant: str | None = None) -> bool:
        """Freeze the session's container (cgroup freezer); False if it was already paused.
        A session in the middle of a call is ``busy``: freezing it would stall that call."""
        session = self.find_session(session_id, tenant=tenant)
        async with session.state_lock:
            if session.paused:
                return False
            if session.busy:
                raise BusyError(f"session {session.id} is in the middle of a call")
            await self.backend.pause(session.container_id)
            session.paused = True
        log.info("session %s paused", session.id)
        return True

    async def _pause_if_idle(self, session: Session) -> None:
        """The reaper's pause: idleness is judged again under the lock, so a call that has just
        thawed the session is never frozen in its stride."""
        async with session.state_lock:
            if session.paused or not should_pause(session):
                return
            await self.backend.pause(session.container_id)
            session.paused = True
        log.info("session %s paused: idle", session.id)

    async def resume(self, session_id: Any, *, tenant: str | None = None) -> bool:
        """Thaw a paused session; False if it was running. Any call on it does this too."""
        session = self.find_session(session_id, tenant=tenant)
        return await self._thaw(session)

    @contextlib.asynccontextmanager
    async def _turn(self, session: Session) -> AsyncIterator[None]:
        """The session's interpreter for one call, thawed: a pause that slipped in between
        finding the session and getting its turn is undone here."""
        async with session.turn(busy_timeout=self.config.busy_timeout):
            if session.paused:
                await self._thaw(session)
            yield

    async def _thaw(self, session: Session) -> bool:
        async with session.state_lock:
            if not session.paused:
                return False
            await self.backend.unpause(session.container_id)
            session.paused = False
        session.touch()
        return True

    async def destroy(self, session_id: Any, *, tenant: str | None = None) -> bool:
        """End the caller's session; True if this call ended it, False if it had already ended
        (destroy is idempotent for the owner). Unknown ids are ``session_not_found``."""
        check_session_id(session_id)
        if self._ended.reason(tenant or self.config.tenant, session_id) is not None:
            return False
        session = self.find_session(session_id, tenant=tenant)
        await self.end_session(session, "destroyed by its owner")
        return True

    async def end_session(self, session: Session, reason: str) -> None:
        if self._sessions.pop(session.id, None) is None:
            return
        self._ended.record(session, reason)
        self._items = {key: sid for key, sid in self._items.items() if sid != session.id}
        log.info("session %s of %s ended: %s", session.id, session.tenant, reason)
        await session.aclose(self.backend)

    async def drop_vanished_sessions(self) -> None:
        """End every session whose container the engine no longer has (removed from outside)."""
        alive = set(
            await self.backend.list_containers({LABEL_ORCHESTRATOR: self.config.orchestrator_id})
        )
        for session in list(self._sessions.values()):
            if session.container_id not in alive:
                await self.end_session(session, "its container disappeared")

    async def _reap_forever(self) -> None:
        """End sessions past their idle timeout or maximum lifetime, for as long as we run."""
        while True:
            interval = reap_interval(self._sessions.values(), self.policy(None).timeouts.idle_s)
            await anyio.sleep(min(interval, self.config.reap_interval))
            for session in list(self._sessions.values()):
                reason = expiry_reason(session)
                if reason is not None:
                    await self.end_session(session, reason)
                elif should_pause(session):
                    with contextlib.suppress(BackendError):
                        await self._pause_if_idle(session)

    def list_sessions(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        tenant = tenant or self.config.tenant
        return [
            {
                "session_id": s.id,
                "policy": s.policy.name,
                "created_at": s.created_at.isoformat(),
                "idle_seconds": round(s.idle_seconds, 3),
                "commands_count": s.history.count,
            }
            for s in self._sessions.values()
            if s.tenant == tenant
        ]

    # -- python_repl ----------------------------------------------------------------------

    async def execute(
        self,
        code: Any,
        *,
        session_id: Any = None,
        timeout_s: Any = None,
        policy: str | None = None,
        tenant: str | None = None,
    ) -> ExecuteResult:
        check_code(code)
        if session_id is None:
            check_timeout(timeout_s, self.policy(check_policy_name(policy)))
        session, created = await self.open_session(session_id, policy=policy, tenant=tenant)
        timeout = check_timeout(timeout_s, session.policy)
        async with self._turn(session):
            outcome = await session.repl.execute(code, timeout=timeout)
        output = outcome.stdout + outcome.stderr
        if not outcome.success:
            output += f"{outcome.error_type}: {outcome.error_message}"
        session.history.record(code, success=outcome.success, output=output)
        return ExecuteResult(
            **outcome.model_dump(), session_id=session.id, created_new_session=created
        )

    async def reset(self, session_id: Any, *, tenant: str | None = None) -> None:
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session):
            await session.repl.reset()
            session.history.clear()

    async def list_variables(
        self, session_id: Any, *, tenant: str | None = None
    ) -> ListVariablesReply:
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session):
            return await session.repl.list_variables()

    async def inspect(
        self, session_id: Any, variable_name: Any, *, tenant: str | None = None
    ) -> InspectReply:
        check_variable(variable_name)
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session):
            return await session.repl.inspect(variable_name)

    def history(self, session_id: Any, *, tenant: str | None = None) -> list[dict[str, object]]:
        return [e.to_dict() for e in self.find_session(session_id, tenant=tenant).history.entries]

    def history_context(
        self, session_id: Any, max_tokens: Any = 50_000, *, tenant: str | None = None
    ) -> str:
        check_max_tokens(max_tokens)
        return self.find_session(session_id, tenant=tenant).history.context(max_tokens)
