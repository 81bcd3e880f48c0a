"""The session manager: sessions, who owns them, their pools, the reaper and the reconcile (the
python_repl operations on its sessions are ``repl_operations``', a subclass of it).

Invariants: a session id is visible only to its owner (``owners``), and an unknown id and another
owner's id raise the same ``SessionNotFoundError``; a session is created whole (container and
ready worker) or not at all, and only within its tenant's quotas; every live session is in the
registry (``store``), so a restart after a crash re-adopts it (``reconcile``); ``aclose`` removes
every container this orchestrator created (or, with ``on_shutdown="persist"``, leaves them for
the next start), shielded and bounded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from orchestrator._core.call_context import current_call
from orchestrator._core.config import OrchestratorConfig as OrchestratorConfig  # re-exported
from orchestrator._core.egress_round import EgressAccounting
from orchestrator._core.engines import image_source, open_backend
from orchestrator._core.lifecycle import (
    eviction_candidate,
    expiry_reason,
    reap_interval,
    should_pause,
)
from orchestrator._core.limits import MAX_POOL_SIZE
from orchestrator._core.metrics import (
    Metrics,
    SessionView,
    ending_kind,
)
from orchestrator._core.owners import SHARE_ACTIONS, check_task, current_task, may_see
from orchestrator._core.pool import WarmPool
from orchestrator._core.quotas import Admission, check_policy_allowed, per_session_cap
from orchestrator._core.readiness import OK, UNCHECKED, readiness
from orchestrator._core.reconciler import Reconciler
from orchestrator._core.session_control import check_metadata, session_metrics, set_lifetime
from orchestrator._core.session_table import SessionTable
from orchestrator._core.snapshots import Snapshots
from orchestrator._core.tenants import TenantConfig
from orchestrator._core.usage import UsageSampler, session_row, session_state
from orchestrator.audit._log import AuditLog
from orchestrator.backend.base import Backend, ContainerSpec
from orchestrator.errors import (
    BackendError,
    BackendUnavailableError,
    BusyError,
    ContainerNotFoundError,
    InvalidArgumentError,
    OrchestratorError,
    PolicyViolationError,
    SessionNotFoundError,
)
from orchestrator.images.templates import BASE, TemplateCatalog, load_catalog
from orchestrator.policy.arguments import (
    check_policy_name,
    check_session_id,
)
from orchestrator.policy.catalog import PolicyCatalog
from orchestrator.policy.egress import capped_allowlist, narrowed_allowlist
from orchestrator.policy.env import check_env
from orchestrator.policy.model import Policy
from orchestrator.registry.claim import Abandoned, claim, reap_abandoned, remove_files
from orchestrator.registry.reconcile import ReconcileReport
from orchestrator.registry.store import Registry
from orchestrator.session.session import Session, new_session_id

log = logging.getLogger(__name__)

# Pooled sessions carry this tenant label: labels are fixed at creation, owners come later.
POOL_TENANT = "pool"

# Teardown of one session is a SIGKILL and a container removal; a whole shutdown gets this long.
SHUTDOWN_TIMEOUT = 60.0


class SessionManager:
    def __init__(
        self, config: OrchestratorConfig | None = None, *, backend: Backend | None = None
    ) -> None:
        self.config = config or OrchestratorConfig()
        # A backend made here is closed here (its engine connections); a given one is the
        # caller's, who may share it.
        self._owns_backend = backend is None
        self.backend = backend or open_backend(self.config.backend)
        self._images = image_source(self.backend, self.config, self.templates)
        self._image = self.config.image
        # Templates by name (read on first use, again on reload) and the image of each that is
        # known (configured, found current or built); a lock each, so one build serves all.
        self._catalog: TemplateCatalog | None = None
        self._template_images: dict[str, str] = dict(self.config.template_images)
        self._template_locks: dict[str, anyio.Lock] = {}
        self._registry = Registry(self.config.registry_path)
        self._table = SessionTable(self._registry)
        self.metrics = Metrics(
            sessions=self._session_views,
            pools=self.pool_status,
            operations=self._tool_operations(),
        )
        self._reconciler = Reconciler(
            self.backend,
            self._table,
            in_flight=self._in_flight,
            end_session=self.lose_session,
            adopted=self._apply_tenant_caps,
            metrics=self.metrics,
        )
        self.orchestrator_id = self.config.orchestrator_id or ""
        # Creations in flight, counted against every limit.
        self._admission = Admission(self.config.max_sessions)
        # Session ids whose container exists or is being made but which are in no table yet.
        self._building: set[str] = set()
        self._policies: PolicyCatalog | None = None
        self._pools: dict[str, WarmPool] = {}
        self._audit: AuditLog | None = None
        self._exit_stack = contextlib.AsyncExitStack()
        self._task_group: anyio.abc.TaskGroup | None = None
        # Made in start(): a cancel scope belongs to an event loop, and this may run outside one.
        self._reaper: anyio.CancelScope | None = None
        self.last_reconcile = ReconcileReport()
        self.egress = EgressAccounting(self.backend, self.metrics, self.tenant_config)
        self._usage = UsageSampler(
            self.backend, lambda: {s.id: s.container_id for s in self._sessions.values()}
        )
        self.snapshots = Snapshots(
            self.backend,
            registry=lambda: self._registry,
            tenant_config=self.tenant_config,
            orchestrator_id=lambda: self.orchestrator_id,
            extra_labels=self.config.extra_labels,
        )

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

    @property
    def _sessions(self) -> dict[str, Session]:
        return self._table.sessions

    async def start(self) -> None:
        """Check the engine, open the registry, load the default policy, make sure the image
        exists, open the task group that owns every session's background tasks, and reconcile:
        re-adopt the sessions the registry knows, reap the containers it does not.

        Call ``start`` and ``aclose`` from the same task (``async with`` does)."""
        await self.backend.ping()
        self._policies = await anyio.to_thread.run_sync(self._load_policies, self.templates())
        abandoned = self._open_registry()
        self.orchestrator_id = self._registry.orchestrator_id(
            self.config.orchestrator_id, f"sandhold-{secrets.token_hex(6)}"
        )
        if self.config.audit_dir is not None:
            self._audit = await AuditLog.open(self.config.audit_dir, self.config.audit)
        if self._image is None:
            self._image = await self._images.image_for(BASE)
        self._task_group = await self._exit_stack.enter_async_context(anyio.create_task_group())
        self.last_reconcile = await self.reconcile(adopt=True)
        for dead in abandoned:
            reaped = await reap_abandoned(self.backend, dead)
            self.metrics.reaped.labels("abandoned_orchestrator").inc(len(reaped))
            self.last_reconcile.reaped.extend(reaped)
        if self.last_reconcile.adopted or self.last_reconcile.reaped:
            log.info("reconciled: %s", self.last_reconcile.summary())
        with contextlib.suppress(BackendError):  # an engine that lists no images: next round
            await self.snapshots.sweep()
        self._reaper = anyio.CancelScope()
        self._task_group.start_soon(self._reap_forever, self._reaper)
        for name, size in self.config.pool.items():
            await self.set_pool_size(name, size)

    def _open_registry(self) -> list[Abandoned]:
        """Open the registry (the one file, or a claimed one of ``registry_dir``) and close it
        last; returns the dead orchestrators' registries to reap."""
        directory = self.config.registry_dir
        if directory is None:
            self._registry.open()
            self._exit_stack.callback(self._registry.close)
            return []
        self._registry, abandoned = claim(
            directory, wanted_id=self.config.orchestrator_id, adopt=self.config.adopt_dead
        )
        self._table.store = self._registry
        self._exit_stack.callback(self._release_claimed_registry)
        for dead in abandoned:  # reaped and closed by start(); closed here if start() fails first
            self._exit_stack.callback(dead.registry.close)
        return abandoned

    def _release_claimed_registry(self) -> None:
        """A claimed registry that keeps no session is deleted with its lock, so the directory
        holds only live orchestrators and those that left sessions to re-adopt or reap."""
        path, keeps = self._registry.path, bool(self._registry.sessions())
        self._registry.close()
        if path is not None and not keeps:
            remove_files(path)

    async def aclose(self) -> None:
        keep = self.config.on_shutdown == "persist"
        # First the reaper: its reconcile would take sessions being let go for orphans.
        if self._reaper is not None:
            self._reaper.cancel()
        for pool in self._pools.values():
            pool.resize(0)
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_TIMEOUT):
            sessions = list(self._sessions.values())
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    if keep:
                        tg.start_soon(self._leave_for_next_start, session)
                    else:
                        tg.start_soon(self.end_session, session, "the orchestrator shut down")
        if self._task_group is not None:
            # Cancelling ends the pools' refill tasks, which remove what they still hold.
            self._task_group.cancel_scope.cancel()
            self._task_group = None
        self._pools.clear()
        # The images of deleted snapshots that the sessions just ended still used go now; a
        # registry in memory or claimed goes with its process, and so do its snapshots. (A
        # start that failed has no reaper, and maybe no registry: nothing to sweep.)
        with anyio.CancelScope(shield=True), contextlib.suppress(OrchestratorError):
            if self._reaper is not None and not keep:
                if self.config.registry_path is None:
                    await self.snapshots.discard_all()
                else:
                    await self.snapshots.sweep()
        if self._audit is not None:
            await self._audit.aclose()
            self._audit = None
        # Outside the scopes above: the task group must be exited as the innermost scope.
        await self._exit_stack.aclose()
        if self._owns_backend:
            with anyio.CancelScope(shield=True):
                await self.backend.aclose()

    async def _leave_for_next_start(self, session: Session) -> None:
        """Shut down without ending: the container and its worker stay, the registry keeps the
        row, and the next start re-adopts it. Terminals and the shell end (nothing would read
        them); their processes are killed here rather than left for the sweep."""
        self._sessions.pop(session.id, None)
        await session.close_parts(keep_worker=True)
        log.info("session %s left running for the next start", session.id)

    def policy(self, name: Any) -> Policy:
        """The loaded policy of that name (None: the default). Every interface and operation
        resolves a caller's policy here, and nothing here touches the filesystem
        (``PolicyCatalog.get``)."""
        return self.policy_catalog().get(name)

    def policy_catalog(self) -> PolicyCatalog:
        """The policies loaded at start or at the last reload (loaded here when neither ran)."""
        if self._policies is None:
            self._policies = self._load_policies(self.templates())
        return self._policies

    def _load_policies(self, catalog: TemplateCatalog) -> PolicyCatalog:
        loaded = PolicyCatalog.load(
            self.config.policy_dirs, default=self.config.default_policy, templates=catalog.names()
        )
        loaded.require(set(self._pools))
        return loaded

    def templates(self) -> TemplateCatalog:
        """The image templates: shipped, and those of the template directories."""
        if self._catalog is None:
            self._catalog = load_catalog(self.config.user_template_dirs())
        return self._catalog

    def _tool_operations(self) -> dict[str, list[str]]:
        """The tools and operations the call metrics count by name (the manager knows no tool;
        ``Orchestrator`` names them); anything else counts as ``unknown``."""
        return {}

    def _session_views(self) -> list[SessionView]:
        return [
            SessionView(
                state=session_state(s),
                tenant=s.tenant,
                policy=s.policy.name,
            )
            for s in self._sessions.values()
        ]

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        """Whether a session can be made now, and each check's answer (``readiness``)."""
        checks = await readiness(self.backend, self._images, self._image, self._registry)
        return all(answer in (OK, UNCHECKED) for answer in checks.values()), checks

    async def reload(self, *, tenants: Mapping[str, TenantConfig] | None = None) -> None:
        """Read policies again (SIGHUP): the default one and the pools' now, so that a broken
        file is refused here with nothing changed, the others when next used; live sessions
        keep the policy they were made with; pools of a changed policy refill under the new
        one. ``tenants`` replaces the tenants' allowed policies and quotas (their sessions
        stay)."""
        catalog = await anyio.to_thread.run_sync(load_catalog, self.config.user_template_dirs())
        policies = await anyio.to_thread.run_sync(self._load_policies, catalog)
        self._policies = policies
        # A template file may have changed: its image is looked up again on next use.
        self._catalog = catalog
        self._template_images = dict(self.config.template_images)
        if tenants is not None:
            self.config = dataclasses.replace(self.config, tenants=tenants)
        for name, pool in self._pools.items():
            if policies.get(name) != pool.policy:
                pool.use_policy(policies.get(name))

    def tenant_config(self, tenant: str) -> TenantConfig | None:
        return self.config.tenants.get(tenant)

    @property
    def audit_log(self) -> AuditLog | None:
        """The open audit log (None when none is kept, or before ``start``): interfaces record
        what they refuse before a tool runs in it."""
        return self._audit

    # -- sessions -------------------------------------------------------------------------

    async def create_session(
        self,
        *,
        policy: str | None = None,
        tenant: str | None = None,
        env: Any = None,
        metadata: Any = None,
        snapshot: Any = None,
    ) -> Session:
        """A new session for the caller; ``env`` (checked against its policy before anything
        is made) is seen by every process in it; ``metadata`` is kept with it (``list``). From
        a ``snapshot`` (``snapshots``): its files, policy, env and metadata, the last two
        updated by those given."""
        tenant = tenant or self.config.tenant
        task = current_task()
        image, unpack = None, None
        if snapshot is not None:
            policy, env, metadata, image = self.snapshots.start_from(
                snapshot, tenant, policy=policy, env=env, metadata=metadata
            )
            unpack = self.snapshots.unpack
        effective = self.policy(policy)
        session_env = check_env(env, effective)
        labels = check_metadata(metadata)
        limits = self.tenant_config(tenant)
        check_policy_allowed(limits, effective)
        self._check_open(tenant, task)
        self._admission.check_owner(
            list(self._sessions.values()), tenant=tenant, task=task, policy=effective, limits=limits
        )
        await self._make_room(tenant, task)
        token = self._admission.reserve(
            self._sessions.values(), tenant=tenant, task=task, policy=effective, limits=limits
        )
        try:
            session = await self._build_session(
                tenant, effective, session_env, image=image, prepare=unpack
            )
        finally:
            self._admission.release(token)
        # The owner may have been closed while the container was made: nothing half-made stays.
        if self._table.grants.sealed(tenant, task):
            await self.end_session(session, "its owner was closed while it was created")
            raise SessionNotFoundError(f"task {task} was closed")
        session.metadata = labels
        return session

    def _check_open(self, tenant: str, task: str | None) -> None:
        if self._table.grants.sealed(tenant, task):
            raise PolicyViolationError(
                f"task {task} was closed (close_owner); use another task", rule="closed_owner"
            )

    async def _make_room(self, tenant: str, task: str | None) -> None:
        """At ``max_sessions``, end the caller's least recently active idle session (seed
        000's rule), never another owner's: without one of its own, the create is refused."""
        if len(self._sessions) + len(self._admission) < self.config.max_sessions:
            return
        own = [s for s in self._sessions.values() if s.tenant == tenant and may_see(s.task, task)]
        victim = eviction_candidate(own)
        if victim is not None:
            await self.end_session(victim, "evicted: the orchestrator is at max_sessions")

    async def _build_session(
        self,
        tenant: str,
        policy: Policy,
        env: Mapping[str, str],
        *,
        image: str | None = None,
        prepare: Callable[[Session], Awaitable[None]] | None = None,
    ) -> Session:
        pool = None if image is not None else self._pools.get(policy.name)
        warm = pool.take_nowait() if pool is not None and pool.policy == policy else None
        if pool is not None:
            self.metrics.pool_takes.labels(policy.name, "miss" if warm is None else "hit").inc()
        if warm is not None:
            warm.tenant = tenant
            warm.touch()
            session = warm
        else:
            session = await self._new_session(tenant, policy, image=image, prepare=prepare)
        # Counted as in flight until it is in the table: taken from the pool or just made, it
        # is in neither, and a reconcile meanwhile would take its container for an orphan.
        self._building.add(session.id)
        try:
            return await self._hand_out(session, tenant, env)
        finally:
            self._building.discard(session.id)

    async def _hand_out(self, session: Session, tenant: str, env: Mapping[str, str]) -> Session:
        # One path for warm and cold: the env and the tenant's egress cap are given once the
        # session exists, before any of the caller's code runs in it.
        try:
            await session.set_env(env)
            await self._cap_egress(session, tenant)
            await self.egress.admit(session)  # a tenant over its egress quota: refused at once
        except BaseException:
            await session.aclose(self.backend)  # shielded: not in the table, nothing else would
            raise
        session.task = current_task()
        self._apply_tenant_caps(session)
        try:
            self._table.add(session)
        except BaseException:  # its row refused (a full disk): the container must not stay
            await session.aclose(self.backend)
            raise
        return session

    async def _cap_egress(self, session: Session, tenant: str) -> None:
        limits = self.tenant_config(tenant)
        cap = capped_allowlist(
            session.policy.network, limits.egress_allow if limits is not None else None
        )
        if cap is not None:
            await self.backend.set_egress_allow(session.container_id, cap)

    async def _new_session(
        self,
        tenant: str,
        policy: Policy,
        *,
        preload: bool = False,
        image: str | None = None,
        prepare: Callable[[Session], Awaitable[None]] | None = None,
    ) -> Session:
        """A session built cold: its container created and started (from ``image``, else its
        policy's; then ``prepare``d, while a reconcile still counts it as being built), its
        worker ready (with ``preload``, its template's modules imported: a warm pool's
        sessions)."""
        task_group = self._task_group
        if self._image is None or task_group is None:
            raise RuntimeError("start() the orchestrator (or use it as `async with`) first")
        image = image or await self._image_for(policy)
        session_id = new_session_id()
        spec = ContainerSpec(
            image=image,
            policy=policy,
            session_id=session_id,
            tenant=tenant,
            orchestrator_id=self.orchestrator_id,
            extra_labels=self.config.extra_labels,
        )
        self._building.add(session_id)
        try:
            container_id = await self.backend.create_container(spec)
            session = Session.assemble(
                self.backend,
                session_id=session_id,
                tenant=tenant,
                policy=policy,
                container_id=container_id,
                on_new_worker=lambda pid: self._registry.set_worker_pid(session_id, pid),
            )
            try:
                if prepare is not None:
                    await prepare(session)
                await session.repl.start()
                if preload:
                    await self._preload(session)
                await task_group.start(session.terminals.serve)
            except BaseException:
                await session.aclose(self.backend)  # shielded: the container never outlives this
                raise
        finally:
            self._building.discard(session_id)
        return session

    async def _image_for(self, policy: Policy) -> str:
        """The image of the policy's template: the worker image for ``base``; for another, the
        configured one, else the current one, built on first use (Docker) with its progress in
        the log; one build at a time per template, whoever else waits for it."""
        name = policy.image.template
        if name == BASE:
            assert self._image is not None
            return self._image
        if name not in self._template_images:
            lock = self._template_locks.setdefault(name, anyio.Lock())
            async with lock:
                if name not in self._template_images:
                    tag = await self._images.image_for(name)
                    self._template_images[name] = tag
        return self._template_images[name]

    async def _preload(self, session: Session) -> None:
        modules = self.templates().get(session.policy.image.template).preload
        if not modules:
            return
        answer = await session.repl.preload(modules)
        if answer.skipped:
            log.info("pooled session %s did not preload: %s", session.id, "; ".join(answer.skipped))

    # -- reconcile ------------------------------------------------------------------------

    async def reconcile(self, *, adopt: bool = False) -> ReconcileReport:
        """Match the engine's containers of this orchestrator's id with what it knows (at start
        the registry, re-adopting its sessions; later the sessions in memory): ``reconciler``."""
        return await self._reconciler.run(
            self.orchestrator_id, adopt=adopt, task_group=self._task_group
        )

    def _in_flight(self) -> set[str]:
        """Containers (pooled) and session ids (being built) that are in no table yet."""
        pooled = {c for pool in self._pools.values() for c in pool.container_ids()}
        return pooled | self._building

    def _apply_tenant_caps(self, session: Session) -> None:
        limits = self.tenant_config(session.tenant)
        session.terminals.tenant_cap = per_session_cap(limits, "terminals_per_session")
        session.processes.tenant_cap = per_session_cap(limits, "processes_per_session")

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
            build=lambda policy: self._new_session(POOL_TENANT, policy, preload=True),
            discard=self._discard_pooled,
            idle_timeout=self.config.pool_idle_timeout,
        )
        self._pools[effective.name] = pool
        await self._task_group.start(pool.run)

    def pool_status(self) -> dict[str, dict[str, int]]:
        return {name: {"size": p.size, "ready": p.ready} for name, p in self._pools.items()}

    async def _discard_pooled(self, session: Session, reason: str) -> None:
        log.info("pooled session %s removed: %s", session.id, reason)
        await session.aclose(self.backend)

    # -- finding sessions -----------------------------------------------------------------

    async def session(self, session_id: Any, *, tenant: str | None = None) -> Session:
        """The caller's session, ready for work (resumed if it was paused)."""
        session = self.find_session(session_id, tenant=tenant)
        if session.paused:
            await self._thaw(session)
        return session

    def find_session(self, session_id: Any, *, tenant: str | None = None) -> Session:
        """The caller's session as it is; unknown and not-yours are indistinguishable."""
        session = self._table.find(session_id, tenant or self.config.tenant)
        session.touch()
        return session

    async def open_session(
        self,
        session_id: Any,
        *,
        policy: Any = None,
        tenant: str | None = None,
        session_env: Any = None,
    ) -> tuple[Session, bool]:
        """The caller's session, or a new one (with ``session_env``) when ``session_id`` is
        None; says which."""
        if session_id is None:
            name = check_policy_name(policy)
            env = check_env(session_env, self.policy(name), name="session_env")
            session = await self.create_session(policy=name, tenant=tenant, env=env)
            return session, True
        if policy is not None:
            raise InvalidArgumentError("policy applies only when a new session is created")
        if session_env is not None:
            raise InvalidArgumentError("session_env applies only when a new session is created")
        return await self.session(session_id, tenant=tenant), False

    async def session_of(
        self, kind: str, item_id: Any, *, tenant: str | None = None, action: str | None = None
    ) -> Session:
        """The session holding ``item_id``, if the caller owns it or was granted ``action`` on
        it (terminals only); unknown and not-yours answer alike."""
        session = self._table.holder(kind, item_id, tenant or self.config.tenant, action)
        session.touch()
        if session.paused:
            await self._thaw(session)
        return session

    def list_sessions(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        return [
            {
                "session_id": s.id,
                "policy": s.policy.name,
                "task": s.task,
                "created_at": s.created_at.isoformat(),
                "idle_seconds": round(s.idle_seconds, 3),
                "commands_count": s.history.count,
                "metadata": dict(s.metadata),
            }
            for s in self._table.visible(tenant or self.config.tenant)
        ]

    def session_overview(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        """The caller's sessions for the operations page, with CPU and memory as last sampled
        (``usage``); asking keeps the sampling going. Touches no session."""
        if self._task_group is not None:
            self._usage.watch(self._task_group)
        now = datetime.now(UTC)
        visible = self._table.visible(tenant or self.config.tenant)
        return [session_row(s, self._usage.usage(s.id), now) for s in visible]

    def capacity(self) -> dict[str, int]:
        """Sessions held (every tenant's), being made, and the most this orchestrator holds."""
        return {
            "sessions": len(self._sessions),
            "starting": len(self._admission),
            "max_sessions": self.config.max_sessions,
        }

    # -- owners ---------------------------------------------------------------------------

    async def share(
        self, terminal_id: Any, task: Any, actions: Any, *, tenant: str | None = None
    ) -> list[str]:
        """Grant ``actions`` on one of the calling task's terminals to another task of the same
        tenant. Only the terminal's owner task shares; a grantee cannot pass it on."""
        tenant = tenant or self.config.tenant
        grantee = check_task(task, "task")
        owner = current_task()
        if owner is None or grantee is None:
            raise InvalidArgumentError("share is made by a task, to another task")
        if grantee == owner:
            raise InvalidArgumentError("task must be another task than the caller's")
        if not isinstance(actions, list) or not actions or not set(actions) <= SHARE_ACTIONS:
            raise InvalidArgumentError(
                f"actions must be a non-empty list of {sorted(SHARE_ACTIONS)}"
            )
        session = self._table.holder("terminal", terminal_id, tenant, action=None)
        assert isinstance(terminal_id, str)
        self._table.grants.grant(tenant, grantee, terminal_id, frozenset(actions))
        log.info(
            "%s/%s shared %s of session %s with %s", tenant, owner, actions, session.id, grantee
        )
        return sorted(actions)

    async def close_owner(self, task: Any, *, tenant: str | None = None) -> dict[str, Any]:
        """End everything a task owns and seal it: its grants go, calls in flight for it fail
        at their next check, and no new session is made for it. Reports whether it converged
        (every session of the task ended within the shutdown bound)."""
        tenant = tenant or self.config.tenant
        closing = check_task(task, "task")
        caller = current_task()
        if closing is None:
            raise InvalidArgumentError("task is required")
        if caller is not None and caller != closing:
            raise SessionNotFoundError(f"task not found: {closing}")
        self._table.grants.seal(tenant, closing)
        ended = 0
        with anyio.move_on_after(SHUTDOWN_TIMEOUT):
            for session in self._table.owned_by(tenant, closing):
                await self.end_session(session, f"its owner task {closing} was closed")
                ended += 1
        left = len(self._table.owned_by(tenant, closing))
        starting = self._admission.starting(tenant, closing)
        return {"task": closing, "sessions_ended": ended, "converged": left == 0 and not starting}

    # -- egress ---------------------------------------------------------------------------

    async def network_log(
        self, session_id: Any, *, tenant: str | None = None
    ) -> list[dict[str, Any]]:
        """The session's egress attempts, oldest first; empty when its policy has no network."""
        session = self.find_session(session_id, tenant=tenant)
        if session.policy.network.mode == "none":
            return []
        return await self.backend.network_log(session.container_id)

    async def set_allowlist(
        self, session_id: Any, allow: Any, *, tenant: str | None = None
    ) -> list[str]:
        """Replace the session's egress allowlist for new connections, within its policy's and
        its tenant's cap (``policy.egress``); the rules now in force."""
        session = self.find_session(session_id, tenant=tenant)
        if not isinstance(allow, list):
            raise InvalidArgumentError("allow must be a list of rules")
        limits = self.tenant_config(session.tenant)
        cap = limits.egress_allow if limits is not None else None
        rules = narrowed_allowlist(session.policy.network, allow, cap)
        await self.backend.set_egress_allow(session.container_id, rules)
        log.info("session %s: egress allowlist now %s", session.id, rules)
        return rules

    async def network_denied_since(
        self, session_id: str, since: float, *, tenant: str | None = None
    ) -> list[dict[str, Any]]:
        """``{host, port, rule}`` of each egress attempt refused since ``since`` (wall clock,
        which the proxy's container shares), for a call's result; empty without a network or
        when the session has ended meanwhile. The attempts since then, allowed or not, and
        their bytes are tallied on the current call (``CallContext.egress``) for its audit
        record."""
        try:
            session = self.find_session(session_id, tenant=tenant)
        except OrchestratorError:
            return []
        if session.policy.network.mode == "none" or session.closed:
            return []
        try:
            entries = await self.backend.network_log(session.container_id)
        except OrchestratorError as exc:
            log.warning("session %s: its egress log could not be read: %s", session.id, exc)
            return []
        recent = [e for e in entries if e["time"] >= since]
        denied = [e for e in recent if e["decision"] == "deny"]
        if recent and (call := current_call()) is not None:
            call.egress.update(
                attempts=len(recent),
                denied=len(denied),
                bytes_sent=sum(e["bytes_sent"] for e in recent),
                bytes_received=sum(e["bytes_received"] for e in recent),
            )
        return [{"host": e["host"], "port": e["port"], "rule": e["rule"]} for e in denied]

    async def set_timeout(
        self, session_id: Any, timeout_s: Any, *, tenant: str | None = None
    ) -> dict[str, Any]:
        """End the caller's session ``timeout_s`` from now, within its policy's maximum
        lifetime (``session_control``); a paused session stays paused."""
        return set_lifetime(self.find_session(session_id, tenant=tenant), timeout_s)

    async def session_metrics(
        self, session_id: Any, *, tenant: str | None = None
    ) -> dict[str, Any]:
        """The caller's session's CPU and memory now, asked of the engine (a paused one too)."""
        return await session_metrics(self.backend, self.find_session(session_id, tenant=tenant))

    # -- snapshots (``snapshots``) --------------------------------------------------------

    async def snapshot(self, session_id: Any, *, tenant: str | None = None) -> dict[str, Any]:
        """Snapshot the caller's session between its calls (``snapshots``)."""
        session = await self.session(session_id, tenant=tenant)
        async with self._turn(session, "session.snapshot"):
            return await self.snapshots.take(session, task=current_task())

    async def fork(self, session_id: Any, *, tenant: str | None = None) -> Session:
        """A new session from a snapshot of the caller's session, which goes at once (its image
        once the fork ends: ``Snapshots.sweep``)."""
        taken = await self.snapshot(session_id, tenant=tenant)
        try:
            return await self.create_session(tenant=tenant, snapshot=taken["snapshot_id"])
        finally:
            with anyio.CancelScope(shield=True):
                await self.snapshots.delete(taken["snapshot_id"], tenant or self.config.tenant)

    def list_snapshots(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        return self.snapshots.listed(tenant or self.config.tenant)

    async def delete_snapshot(
        self, snapshot_id: Any, *, tenant: str | None = None
    ) -> dict[str, Any]:
        return await self.snapshots.delete(snapshot_id, tenant or self.config.tenant)

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
    async def _turn(self, session: Session, call: str = "a call") -> AsyncIterator[None]:
        """The session's interpreter for ``call`` (named in a waiting call's ``busy``), thawed: a
        pause that slipped in between finding the session and getting its turn is undone here.
        The owner is checked again once the turn is ours: the session may have ended, or its
        task been closed, meanwhile."""
        async with session.turn(busy_timeout=self.config.busy_timeout, call=call):
            if session.closed or self._table.grants.sealed(session.tenant, current_task()):
                # Ended while this call waited for its turn (the reaper, a destroy): say why.
                raise self._table.not_found(session.id, session.tenant)
            if session.paused:
                await self._thaw(session)
            yield

    async def _thaw(self, session: Session) -> bool:
        async with session.state_lock:
            if not session.paused:
                return False
            try:
                await self.backend.unpause(session.container_id)
            except (BackendUnavailableError, ContainerNotFoundError):
                raise
            except BackendError as exc:
                # The engine says it is not paused: an engine restart stopped it (or someone
                # thawed it from outside). A stopped one is lost, which the caller is told.
                state = await self.backend.container_state(session.container_id)
                if not state.running:
                    raise ContainerNotFoundError(
                        f"its container stopped while paused: {exc}"
                    ) from exc
            session.paused = False
        session.touch()
        return True

    # -- ending sessions ------------------------------------------------------------------

    async def destroy(self, session_id: Any, *, tenant: str | None = None) -> bool:
        """End the caller's session; True if this call ended it, False if it had already ended
        (destroy is idempotent for the owner). Unknown ids are ``session_not_found``."""
        check_session_id(session_id)
        if self._table.ended_reason(tenant or self.config.tenant, session_id) is not None:
            return False
        session = self.find_session(session_id, tenant=tenant)
        await self.end_session(session, "destroyed by its owner")
        return True

    async def lose_session(self, session: Session, cause: str) -> None:
        """End a session whose container died under it: its owner is told ``session_lost``."""
        await self.end_session(session, cause, lost=True)

    async def end_session(self, session: Session, reason: str, *, lost: bool = False) -> None:
        if not self._table.remove(session, reason, lost=lost):
            return
        self.metrics.sessions_ended.labels(ending_kind(reason)).inc()
        log.info(
            "session %s of %s ended: %s", session.id, session.tenant, reason,
            extra={"session": session.id},
        )  # fmt: skip
        with anyio.CancelScope(shield=True):
            await self.egress.final(session)
        await session.aclose(self.backend)

    async def drop_vanished_sessions(self) -> None:
        """End every session whose container stopped or vanished (killed or removed from
        outside, or stopped by an engine restart); the engine said one of ours is gone."""
        report = await self.reconcile()
        if report.forgotten or report.reaped:
            log.info("reconciled: %s", report.summary())

    async def _reap_forever(self, scope: anyio.CancelScope) -> None:
        """Until ``scope`` is cancelled: end sessions past their idle timeout (unless they still
        have work running) or maximum lifetime, pause idle ones whose policy says so, and
        reconcile the engine's containers with the sessions we hold."""
        with scope:
            await self._reap_rounds()

    async def _reap_rounds(self) -> None:
        while True:
            interval = reap_interval(self._sessions.values(), self.policy(None).timeouts.idle_s)
            await anyio.sleep(min(interval, self.config.reap_interval))
            for session in list(self._sessions.values()):
                with contextlib.suppress(BackendError):
                    await self._reap_one(session)
            await self.egress.round(list(self._sessions.values()))
            await self.snapshots.sweep_if_due()
            try:
                report = await self.reconcile()
            except BackendError as exc:
                log.warning("reconcile skipped: %s", exc)
            else:
                if report.reaped or report.forgotten:
                    log.info("reconciled: %s", report.summary())

    async def _reap_one(self, session: Session) -> None:
        reason = expiry_reason(session)
        idle_reason = reason is not None and reason.startswith("idle")
        if (idle_reason or should_pause(session)) and await self._has_running_work(session):
            session.touch()  # a server or a long job at work: not idle, whatever the clock says
            log.info("session %s not idle: it has running processes or listening ports", session.id)
            return
        if reason is not None:
            await self.end_session(session, reason)
        elif should_pause(session):
            await self._pause_if_idle(session)

    async def _has_running_work(self, session: Session) -> bool:
        if not session.policy.timeouts.idle_counts_processes or session.paused:
            return False
        listed = await session.processes.list()
        return bool(listed.listening) or any(p.state == "running" for p in listed.processes)
