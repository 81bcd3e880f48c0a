"""The warm pools of an orchestrator, one per pooled policy (``pool.WarmPool``): made, resized and
drained here, and asked for a ready session when one of their policy is created.

Invariants: at most one pool per policy name; a pool runs in the orchestrator's task group (its
refill task removes what it still holds when that group is cancelled); a take counts as a hit or
a miss in the metrics; a pool whose policy changed (a reload) retires what it holds and refills
under the new one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio.abc

from orchestrator._core.limits import MAX_POOL_SIZE
from orchestrator._core.metrics import Metrics
from orchestrator._core.pool import WarmPool
from orchestrator.backend.base import Backend
from orchestrator.errors import InvalidArgumentError
from orchestrator.policy.catalog import PolicyCatalog
from orchestrator.policy.model import Policy
from orchestrator.session.session import Session

__all__ = ["WarmPools", "check_pool_size"]

log = logging.getLogger(__name__)


def check_pool_size(size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_POOL_SIZE:
        raise InvalidArgumentError(f"pool size must be an integer in [0, {MAX_POOL_SIZE}]")
    return size


class WarmPools:
    def __init__(self, backend: Backend, metrics: Metrics, *, idle_timeout: float | None) -> None:
        self._backend = backend
        self._metrics = metrics
        self._idle_timeout = idle_timeout
        self._pools: dict[str, WarmPool] = {}

    def names(self) -> set[str]:
        return set(self._pools)

    async def set_size(
        self,
        policy: Policy,
        size: int,
        *,
        build: Callable[[Policy], Awaitable[Session]],
        task_group: anyio.abc.TaskGroup | None,
    ) -> None:
        """Keep ``size`` ready sessions of ``policy``, made by ``build`` (0 drains and stops the
        pool)."""
        check_pool_size(size)
        pool = self._pools.get(policy.name)
        if pool is not None:
            pool.resize(size)
            return
        if size == 0:
            return
        if task_group is None:
            raise RuntimeError("start() the orchestrator (or use it as `async with`) first")
        pool = WarmPool(
            policy,
            size,
            build=build,
            discard=self._discard,
            idle_timeout=self._idle_timeout,
        )
        self._pools[policy.name] = pool
        await task_group.start(pool.run)

    def take(self, policy: Policy) -> Session | None:
        """A ready session of exactly ``policy``, or None (counted: a pooled policy's miss)."""
        pool = self._pools.get(policy.name)
        if pool is None:
            return None
        warm = pool.take_nowait() if pool.policy == policy else None
        self._metrics.pool_takes.labels(policy.name, "miss" if warm is None else "hit").inc()
        return warm

    def status(self) -> dict[str, dict[str, int]]:
        return {name: {"size": p.size, "ready": p.ready} for name, p in self._pools.items()}

    def container_ids(self) -> set[str]:
        """The containers the pools hold or are making: in flight, not orphans."""
        return {c for pool in self._pools.values() for c in pool.container_ids()}

    def use_policies(self, policies: PolicyCatalog) -> None:
        """After a reload: a pool whose policy changed refills under the new one."""
        for name, pool in self._pools.items():
            if policies.get(name) != pool.policy:
                pool.use_policy(policies.get(name))

    def drain(self) -> None:
        """Shutting down: every pool to zero (their refill tasks, cancelled next, remove what
        they still hold)."""
        for pool in self._pools.values():
            pool.resize(0)

    def clear(self) -> None:
        self._pools.clear()

    async def _discard(self, session: Session, reason: str) -> None:
        log.info("pooled session %s removed: %s", session.id, reason)
        await session.aclose(self._backend)
