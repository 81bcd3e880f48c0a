"""The session manager: it creates, finds, owns, turns and ends sessions, and wires its parts,
objects given what they need: making sessions (``session_builder``), the warm pools
(``warm_pools``), policies and templates (``catalogs``), the reaper (``reaper``), pausing
(``pausing``), the sessions' networks (``networking``), owner tasks (``owner_control``), the
reconcile (``reconciler``), snapshots (``snapshots``). The python_repl operations on its sessions
are ``repl_operations``', a subclass of it.

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
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from orchestrator._core.catalogs import Catalogs
from orchestrator._core.config import OrchestratorConfig as OrchestratorConfig  # re-exported
from orchestrator._core.engines import image_source, open_backend
from orchestrator._core.lifecycle import room_victim
from orchestrator._core.metrics import Metrics, SessionView, ending_kind
from orchestrator._core.networking import Networking
from orchestrator._core.owner_control import OwnerControl
from orchestrator._core.owners import current_task
from orchestrator._core.pausing import Pausing
from orchestrator._core.quotas import Admission, apply_tenant_caps, check_policy_allowed
from orchestrator._core.readiness import OK, UNCHECKED, readiness
from orchestrator._core.reaper import Reaper
from orchestrator._core.reconciler import Reconciler
from orchestrator._core.registry_open import open_registry
from orchestrator._core.session_builder import SessionBuilder
from orchestrator._core.session_control import check_metadata, session_metrics, set_lifetime
from orchestrator._core.session_table import SessionTable
from orchestrator._core.snapshots import Snapshots
from orchestrator._core.tenants import TenantConfig
from orchestrator._core.usage import UsageSampler, listing_row, session_row, session_state
from orchestrator._core.warm_pools import WarmPools, check_pool_size
from orchestrator.audit._log import AuditLog
from orchestrator.backend.base import Backend
from orchestrator.errors import (
    BackendError,
    InvalidArgumentError,
    OrchestratorError,
    PolicyViolationError,
    SessionNotFoundError,
)
from orchestrator.images.templates import BASE, TemplateCatalog
from orchestrator.policy.arguments import check_policy_name, check_session_id
from orchestrator.policy.env import check_env
from orchestrator.policy.model import Policy
from orchestrator.registry.reconcile import ReconcileReport
from orchestrator.registry.store import Registry
from orchestrator.session.session import Session

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
        self._catalogs = Catalogs(
            policy_dirs=self.config.policy_dirs,
            default_policy=self.config.default_policy,
            template_dirs=lambda: self.config.user_template_dirs(),
            required=lambda: self._pools.names(),
        )
        self._images = image_source(self.backend, self.config, self.templates)
        # Its registry (``store``): opened or claimed by start (``registry_open``).
        self._table = SessionTable(Registry(self.config.registry_path))
        self.metrics = Metrics(sessions=self._session_views, pools=self.pool_status)
        self._reconciler = Reconciler(
            self.backend,
            self._table,
            in_flight=self._in_flight,
            end_session=self._lose_session,
            adopted=self._apply_tenant_caps,
            metrics=self.metrics,
        )
        self.orchestrator_id = self.config.orchestrator_id or ""
        # Creations in flight, counted against every limit.
        self._admission = Admission(self.config.max_sessions)
        self._pools = WarmPools(
            self.backend, self.metrics, idle_timeout=self.config.pool_idle_timeout
        )
        self._audit: AuditLog | None = None
        self._exit_stack = contextlib.AsyncExitStack()
        self._task_group: anyio.abc.TaskGroup | None = None
        self.last_reconcile = ReconcileReport()
        self._network = Networking(self.backend, self.metrics, self._tenant_config)
        self.egress = self._network.accounting
        self._pausing = Pausing(self.backend, lifetime_changed=self._lifetime_changed)
        self._owners = OwnerControl(
            self._table,
            self._admission,
            end_session=self._end_session,
            close_timeout=SHUTDOWN_TIMEOUT,
        )
        self._builder = SessionBuilder(
            self.backend,
            images=self._images,
            templates=self.templates,
            table=self._table,
            network=self._network,
            pools=self._pools,
            orchestrator_id=lambda: self.orchestrator_id,
            task_group=lambda: self._task_group,
            tenant_caps=self._apply_tenant_caps,
            base_image=self.config.image,
            template_images=self.config.template_images,
            extra_labels=self.config.extra_labels,
        )
        self._usage = UsageSampler(
            self.backend, lambda: {s.id: s.container_id for s in self._table.sessions.values()}
        )
        self.snapshots = Snapshots(
            self.backend,
            registry=lambda: self._table.store,
            tenant_config=self._tenant_config,
            orchestrator_id=lambda: self.orchestrator_id,
            extra_labels=self.config.extra_labels,
        )
        self.reaper = Reaper(
            sessions=lambda: list(self._table.sessions.values()),
            default_idle_s=lambda: self.policy(None).timeouts.idle_s,
            max_interval=self.config.reap_interval,
            end_session=self._end_session,
            pausing=self._pausing,
            egress=self.egress,
            snapshots=self.snapshots,
            reconcile=self.reconcile,
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
    def _registry(self) -> Registry:  # opened, or claimed with a registry_dir, by start()
        return self._table.store

    async def start(self) -> None:
        """Check the engine, open the registry, load the default policy, make sure the image
        exists, open the task group that owns every session's background tasks, and reconcile:
        re-adopt the sessions the registry knows, reap the containers it does not.

        Call ``start`` and ``aclose`` from the same task (``async with`` does)."""
        await self.backend.ping()
        await self._catalogs.load()
        self._table.store, abandoned = open_registry(
            self._table.store, self.config, self._exit_stack
        )
        self.orchestrator_id = self._table.store.orchestrator_id(
            self.config.orchestrator_id, f"sandhold-{secrets.token_hex(6)}"
        )
        if self.config.audit_dir is not None:
            self._audit = await AuditLog.open(self.config.audit_dir, self.config.audit)
        if self._builder.base_image is None:
            self._builder.base_image = await self._images.image_for(BASE)
        self._task_group = await self._exit_stack.enter_async_context(anyio.create_task_group())
        self.last_reconcile = await self.reconcile(adopt=True)
        self.last_reconcile.reaped += await self._reconciler.reap_abandoned(abandoned)
        if self.last_reconcile.adopted or self.last_reconcile.reaped:
            log.info("reconciled: %s", self.last_reconcile.summary())
        with contextlib.suppress(BackendError):  # an engine that lists no images: next round
            await self.snapshots.sweep()
        self.reaper.start(self._task_group)
        for name, size in self.config.pool.items():
            await self.set_pool_size(name, size)

    async def aclose(self) -> None:
        keep = self.config.on_shutdown == "persist"
        # First the reaper: its reconcile would take sessions being let go for orphans.
        self.reaper.cancel()
        self._pools.drain()
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_TIMEOUT):
            sessions = list(self._table.sessions.values())
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    if keep:
                        tg.start_soon(self._leave_for_next_start, session)
                    else:
                        tg.start_soon(self._end_session, session, "the orchestrator shut down")
        if self._task_group is not None:
            # Cancelling ends the pools' refill tasks, which remove what they still hold.
            self._task_group.cancel_scope.cancel()
            self._task_group = None
        self._pools.clear()
        # A start that failed has no reaper, and maybe no registry: nothing to sweep.
        with anyio.CancelScope(shield=True), contextlib.suppress(OrchestratorError):
            if self.reaper.started and not keep:
                await self.snapshots.at_shutdown(in_memory=self.config.registry_path is None)
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
        self._table.sessions.pop(session.id, None)
        await session.close_parts(keep_worker=True)
        log.info("session %s left running for the next start", session.id)

    def policy(self, name: Any) -> Policy:
        """The loaded policy of that name (None: the default). Every interface and operation
        resolves a caller's policy here, and nothing here touches the filesystem
        (``PolicyCatalog.get``)."""
        return self._catalogs.policy(name)

    def templates(self) -> TemplateCatalog:
        """The image templates: shipped, and those of the template directories."""
        return self._catalogs.templates()

    def _session_views(self) -> list[SessionView]:
        return [
            SessionView(session_state(s), s.tenant, s.policy.name)
            for s in self._table.sessions.values()
        ]

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        """Whether a session can be made now, and each check's answer (``readiness``)."""
        base_image = self._builder.base_image
        checks = await readiness(self.backend, self._images, base_image, self._table.store)
        return all(answer in (OK, UNCHECKED) for answer in checks.values()), checks

    async def reload(self, *, tenants: Mapping[str, TenantConfig] | None = None) -> None:
        """Read policies again (SIGHUP): the default one and the pools' now, so that a broken
        file is refused here with nothing changed, the others when next used; live sessions
        keep the policy they were made with; pools of a changed policy refill under the new
        one. ``tenants`` replaces the tenants' allowed policies and quotas (their sessions
        stay)."""
        policies = await self._catalogs.reload()
        # A template file may have changed: its image is looked up again on next use.
        self._builder.forget_images()
        if tenants is not None:
            self.config = dataclasses.replace(self.config, tenants=tenants)
        self._pools.use_policies(policies)

    def _tenant_config(self, tenant: str) -> TenantConfig | None:
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
        image: str | None = None,
    ) -> Session:
        """A new session for the caller; ``env`` (checked against its policy before anything
        is made) is seen by every process in it; ``metadata`` is kept with it (``list``). From
        a ``snapshot`` (``snapshots``): its files, policy, env and metadata, the last two
        updated by those given. From an ``image`` instead of its policy's: in-process adapters
        only (no tool takes it), which pass an image they built for ``tenant``."""
        tenant, task, unpack = tenant or self.config.tenant, current_task(), None
        if snapshot is not None:
            policy, env, metadata, image = self.snapshots.start_from(
                snapshot, tenant, policy=policy, env=env, metadata=metadata
            )
            unpack = self.snapshots.unpack
        effective = self.policy(policy)
        session_env = check_env(env, effective)
        labels = check_metadata(metadata)
        limits = self._tenant_config(tenant)
        check_policy_allowed(limits, effective)
        self._check_open(tenant, task)
        self._admission.check_owner(
            list(self._table.sessions.values()),
            tenant=tenant,
            task=task,
            policy=effective,
            limits=limits,
        )
        victim = room_victim(
            self._table.sessions.values(),
            starting=len(self._admission),
            max_sessions=self.config.max_sessions,
            tenant=tenant,
            task=task,
        )
        if victim is not None:
            await self._end_session(victim, "evicted: the orchestrator is at max_sessions")
        token = self._admission.reserve(
            self._table.sessions.values(), tenant=tenant, task=task, policy=effective, limits=limits
        )
        try:
            session = await self._builder.build(
                tenant, effective, session_env, image=image, prepare=unpack
            )
        finally:
            self._admission.release(token)
        # The owner may have been closed while the container was made: nothing half-made stays.
        if self._table.grants.sealed(tenant, task):
            await self._end_session(session, "its owner was closed while it was created")
            raise SessionNotFoundError(f"task {task} was closed")
        session.metadata = labels
        self._table.save_settings(session)  # metadata in the registry: a restart keeps it
        return session

    def _check_open(self, tenant: str, task: str | None) -> None:
        if self._table.grants.sealed(tenant, task):
            raise PolicyViolationError(
                f"task {task} was closed (close_owner); use another task", rule="closed_owner"
            )

    # -- reconcile ------------------------------------------------------------------------

    async def reconcile(self, *, adopt: bool = False) -> ReconcileReport:
        """Match the engine's containers of this orchestrator's id with what it knows (at start
        the registry, re-adopting its sessions; later the sessions in memory): ``reconciler``."""
        return await self._reconciler.run(
            self.orchestrator_id, adopt=adopt, task_group=self._task_group
        )

    def _in_flight(self) -> set[str]:
        """Containers (pooled) and session ids (being built) that are in no table yet."""
        return self._pools.container_ids() | self._builder.building

    def _apply_tenant_caps(self, session: Session) -> None:
        apply_tenant_caps(session, self._tenant_config(session.tenant))

    # -- warm pools -----------------------------------------------------------------------

    async def set_pool_size(self, policy: str, size: int) -> None:
        """Keep ``size`` ready sessions of ``policy`` (0 drains and stops the pool)."""
        check_pool_size(size)
        await self._pools.set_size(
            self.policy(check_policy_name(policy)),
            size,
            build=lambda policy: self._builder.cold(POOL_TENANT, policy, preload=True),
            task_group=self._task_group,
        )

    def pool_status(self) -> dict[str, dict[str, int]]:
        return self._pools.status()

    # -- finding sessions -----------------------------------------------------------------

    async def session(self, session_id: Any, *, tenant: str | None = None) -> Session:
        """The caller's session, ready for work (resumed if it was paused)."""
        session = self.find_session(session_id, tenant=tenant)
        if session.paused:
            await self._pausing.thaw(session)
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
            await self._pausing.thaw(session)
        return session

    def list_sessions(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        return [listing_row(s) for s in self._table.visible(tenant or self.config.tenant)]

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
            "sessions": len(self._table.sessions),
            "starting": len(self._admission),
            "max_sessions": self.config.max_sessions,
        }

    # -- owners ---------------------------------------------------------------------------

    async def share(
        self, terminal_id: Any, task: Any, actions: Any, *, tenant: str | None = None
    ) -> list[str]:
        """Grant ``actions`` on one of the calling task's terminals to another task of the same
        tenant. Only the terminal's owner task shares; a grantee cannot pass it on."""
        return self._owners.share(terminal_id, task, actions, tenant or self.config.tenant)

    async def close_owner(self, task: Any, *, tenant: str | None = None) -> dict[str, Any]:
        """End everything a task owns and seal it (``owner_control``)."""
        return await self._owners.close(task, tenant or self.config.tenant)

    # -- networks (``networking``) --------------------------------------------------------

    async def network_log(
        self, session_id: Any, *, tenant: str | None = None
    ) -> list[dict[str, Any]]:
        """The session's egress attempts, oldest first; empty when its policy has no network."""
        return await self._network.log(self.find_session(session_id, tenant=tenant))

    async def set_allowlist(
        self, session_id: Any, allow: Any, *, tenant: str | None = None
    ) -> list[str]:
        """Replace the session's egress allowlist for new connections (``networking``)."""
        return await self._network.set_allowlist(
            self.find_session(session_id, tenant=tenant), allow
        )

    async def network_denied_since(
        self, session_id: str, since: float, *, tenant: str | None = None
    ) -> list[dict[str, Any]]:
        """The egress attempts refused since ``since``, for a call's result; empty once the
        session has ended (``Networking.denied_since``)."""
        with contextlib.suppress(OrchestratorError):
            session = self.find_session(session_id, tenant=tenant)
            return await self._network.denied_since(session, since)
        return []

    async def set_timeout(
        self,
        session_id: Any,
        timeout_s: Any,
        *,
        tenant: str | None = None,
        end_action: Any = None,
    ) -> dict[str, Any]:
        """End the caller's session ``timeout_s`` from now, within its policy's maximum
        lifetime (``session_control``); a paused session stays paused. ``end_action``
        ``"pause"`` pauses it at that end instead, until a call or a resume thaws it with a
        fresh ``timeout_s``; None keeps the session's end action (``"end"`` at first)."""
        session = self.find_session(session_id, tenant=tenant)
        ends = set_lifetime(session, timeout_s, end_action=end_action)
        self._lifetime_changed(session)
        return ends

    def _lifetime_changed(self, session: Session) -> None:
        self._table.save_settings(session)  # the end in the registry: a restart keeps it
        self.reaper.wake()  # the reaper's sleep measured again: the end may be nearer

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
        """A new session from a snapshot of the caller's session (gone once the fork ends)."""
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

    # -- pause and resume (``pausing``) ---------------------------------------------------

    async def pause(self, session_id: Any, *, tenant: str | None = None) -> bool:
        """Freeze the session's container (cgroup freezer); False if it was already paused.
        A session in the middle of a call is ``busy``: freezing it would stall that call."""
        return await self._pausing.pause(self.find_session(session_id, tenant=tenant))

    async def resume(self, session_id: Any, *, tenant: str | None = None) -> bool:
        """Thaw a paused session; False if it was running. Any call on it does this too."""
        return await self._pausing.thaw(self.find_session(session_id, tenant=tenant))

    @contextlib.asynccontextmanager
    async def _turn(self, session: Session, call: str = "a call") -> AsyncIterator[None]:
        """The session's interpreter for ``call`` (named in a waiting call's ``busy``), thawed (a
        pause may slip in before the turn), its owner checked again once the turn is ours: the
        session may have ended, or its task been closed, meanwhile."""
        async with session.turn(busy_timeout=self.config.busy_timeout, call=call):
            if session.closed or self._table.grants.sealed(session.tenant, current_task()):
                # Ended while this call waited for its turn (the reaper, a destroy): say why.
                raise self._table.not_found(session.id, session.tenant)
            if session.paused:
                await self._pausing.thaw(session)
            yield

    # -- ending sessions ------------------------------------------------------------------

    async def destroy(self, session_id: Any, *, tenant: str | None = None) -> bool:
        """End the caller's session; True if this call ended it, False if it had already ended
        (destroy is idempotent for the owner). Unknown ids are ``session_not_found``."""
        check_session_id(session_id)
        if self._table.ended_reason(tenant or self.config.tenant, session_id) is not None:
            return False
        session = self.find_session(session_id, tenant=tenant)
        await self._end_session(session, "destroyed by its owner")
        return True

    async def _lose_session(self, session: Session, cause: str) -> None:
        """End a session whose container died under it: its owner is told ``session_lost``."""
        await self._end_session(session, cause, lost=True)

    async def _end_session(self, session: Session, reason: str, *, lost: bool = False) -> None:
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
        """End every session whose container stopped or vanished (killed, removed, stopped)."""
        report = await self.reconcile()
        if report.forgotten or report.reaped:
            log.info("reconciled: %s", report.summary())
