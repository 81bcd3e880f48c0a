"""Making sessions: a container from its policy's template image (built on first use) with its
worker ready, or one taken warm from a pool; then handed out to its owner (its env, its tenant's
egress cap and caps, its row in the table).

Invariants: a session is handed out whole or not at all: a failure at any step removes its
container (shielded), and a row the registry refuses takes the container with it. From the
moment its container exists until it is in the table, its id is in ``building``: the reconcile
counts it in flight, not as an orphan. One image build at a time per template, whoever else
waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import anyio
import anyio.abc

from orchestrator._core.networking import Networking
from orchestrator._core.owners import current_task
from orchestrator._core.session_table import SessionTable
from orchestrator._core.warm_pools import WarmPools
from orchestrator.backend.base import Backend, ContainerSpec, ImageSource
from orchestrator.images.templates import BASE, TemplateCatalog
from orchestrator.policy.model import Policy
from orchestrator.session.session import Session, new_session_id

__all__ = ["SessionBuilder"]

log = logging.getLogger(__name__)

Prepare = Callable[[Session], Awaitable[None]]


class SessionBuilder:
    def __init__(
        self,
        backend: Backend,
        *,
        images: ImageSource,
        templates: Callable[[], TemplateCatalog],
        table: SessionTable,
        network: Networking,
        pools: WarmPools,
        orchestrator_id: Callable[[], str],
        task_group: Callable[[], anyio.abc.TaskGroup | None],
        tenant_caps: Callable[[Session], None],
        base_image: str | None = None,
        template_images: Mapping[str, str] | None = None,
        extra_labels: Mapping[str, str] | None = None,
    ) -> None:
        self._backend = backend
        self._images = images
        self._templates = templates
        self._table = table
        self._network = network
        self._pools = pools
        self._orchestrator_id = orchestrator_id
        self._task_group = task_group
        self._tenant_caps = tenant_caps
        self._extra_labels = dict(extra_labels or {})
        # The worker image (configured, or found at start); the image of each template that is
        # known (configured, found current or built), and a lock each, so one build serves all.
        self.base_image = base_image
        self._configured = dict(template_images or {})
        self._template_images = dict(self._configured)
        self._template_locks: dict[str, anyio.Lock] = {}
        # Session ids whose container exists or is being made but which are in no table yet.
        self.building: set[str] = set()

    def forget_images(self) -> None:
        """A template file may have changed (a reload): its image is looked up again."""
        self._template_images = dict(self._configured)

    async def build(
        self,
        tenant: str,
        policy: Policy,
        env: Mapping[str, str],
        *,
        image: str | None = None,
        prepare: Prepare | None = None,
    ) -> Session:
        """A session for the caller: warm from its policy's pool when one is ready (never for
        a given ``image``), else made cold; handed out."""
        warm = None if image is not None else self._pools.take(policy)
        if warm is not None:
            warm.tenant = tenant
            warm.touch()
            session = warm
        else:
            session = await self.cold(tenant, policy, image=image, prepare=prepare)
        # Counted as in flight until it is in the table: taken from the pool or just made, it
        # is in neither, and a reconcile meanwhile would take its container for an orphan.
        self.building.add(session.id)
        try:
            return await self._hand_out(session, env)
        finally:
            self.building.discard(session.id)

    async def _hand_out(self, session: Session, env: Mapping[str, str]) -> Session:
        # One path for warm and cold: the env and the tenant's egress cap are given once the
        # session exists, before any of the caller's code runs in it.
        try:
            await session.set_env(env)
            await self._network.admit(session)  # a tenant over its egress quota: refused at once
        except BaseException:
            await session.aclose(self._backend)  # shielded: not in the table, nothing else would
            raise
        session.task = current_task()
        self._tenant_caps(session)
        try:
            self._table.add(session)
        except BaseException:  # its row refused (a full disk): the container must not stay
            await session.aclose(self._backend)
            raise
        return session

    async def cold(
        self,
        tenant: str,
        policy: Policy,
        *,
        preload: bool = False,
        image: str | None = None,
        prepare: Prepare | None = None,
    ) -> Session:
        """A session built cold: its container created and started (from ``image``, else its
        policy's; then ``prepare``d, while a reconcile still counts it as being built), its
        worker ready (with ``preload``, its template's modules imported: a warm pool's
        sessions)."""
        task_group = self._task_group()
        if self.base_image is None or task_group is None:
            raise RuntimeError("start() the orchestrator (or use it as `async with`) first")
        image = image or await self._image_for(policy)
        session_id = new_session_id()
        spec = ContainerSpec(
            image=image,
            policy=policy,
            session_id=session_id,
            tenant=tenant,
            orchestrator_id=self._orchestrator_id(),
            extra_labels=self._extra_labels,
        )
        self.building.add(session_id)
        try:
            container_id = await self._backend.create_container(spec)
            session = Session.assemble(
                self._backend,
                session_id=session_id,
                tenant=tenant,
                policy=policy,
                container_id=container_id,
                on_new_worker=lambda pid: self._table.store.set_worker_pid(session_id, pid),
            )
            try:
                if prepare is not None:
                    await prepare(session)
                await session.repl.start()
                if preload:
                    await self._preload(session)
                await task_group.start(session.terminals.serve)
            except BaseException:
                await session.aclose(self._backend)  # shielded: the container never outlives this
                raise
        finally:
            self.building.discard(session_id)
        return session

    async def _image_for(self, policy: Policy) -> str:
        """The image of the policy's template: the worker image for ``base``; for another, the
        configured one, else the current one, built on first use (Docker) with its progress in
        the log; one build at a time per template, whoever else waits for it."""
        name = policy.image.template
        if name == BASE:
            assert self.base_image is not None
            return self.base_image
        if name not in self._template_images:
            lock = self._template_locks.setdefault(name, anyio.Lock())
            async with lock:
                if name not in self._template_images:
                    tag = await self._images.image_for(name)
                    self._template_images[name] = tag
        return self._template_images[name]

    async def _preload(self, session: Session) -> None:
        modules = self._templates().get(session.policy.image.template).preload
        if not modules:
            return
        answer = await session.repl.preload(modules)
        if answer.skipped:
            log.info("pooled session %s did not preload: %s", session.id, "; ".join(answer.skipped))
