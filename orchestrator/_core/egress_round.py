"""Reading the sessions' egress proxies at the reaper's cadence: their bytes and refusals go to
the metrics and the tenant's window (``egress_meter``), and a tenant over its ``egress_mb`` has
every proxy of its sessions refuse with ``tenant.egress_mb`` until the window turns.

Invariants: one exec per session with a network per round, at most ``READ_CONCURRENCY`` at once,
each bounded by the backend's own timeout; a proxy that cannot be read is skipped this round (its
bytes are counted at the next read, the totals being cumulative); a refusal is sent only when it
changes, so a steady state costs no exec but the read. A session's last read (``final``) ends its
proxy's accounting first, so what it moved up to its end counts, however soon the end came; a
session made for a tenant already over its quota is refused from the start (``admit``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import anyio

from orchestrator._core.egress_meter import QUOTA_RULE, EgressMeter
from orchestrator._core.metrics import Metrics
from orchestrator._core.tenants import TenantConfig
from orchestrator.backend.base import Backend
from orchestrator.errors import OrchestratorError
from orchestrator.session.session import Session

__all__ = ["READ_CONCURRENCY", "EgressAccounting"]

log = logging.getLogger(__name__)

# Each read is an exec on the engine; a few at once keep a round short without taking every
# engine thread the sessions' own calls need.
READ_CONCURRENCY = 8
# A session's last read, at its end, must not hold its teardown up for long.
FINAL_READ_TIMEOUT = 5.0


class EgressAccounting:
    def __init__(
        self,
        backend: Backend,
        metrics: Metrics,
        tenant_config: Callable[[str], TenantConfig | None],
        meter: EgressMeter | None = None,
    ) -> None:
        self._backend = backend
        self._metrics = metrics
        self._tenant_config = tenant_config
        self.meter = meter or EgressMeter()
        # The refusal each session's proxy holds now, as this orchestrator set it.
        self._refusing: dict[str, str | None] = {}

    async def _read(self, session: Session, *, final: bool = False) -> None:
        read = self._backend.final_egress_counters if final else self._backend.egress_counters
        try:
            counters = await read(session.container_id)
        except OrchestratorError as exc:
            log.warning("session %s: its egress totals could not be read: %s", session.id, exc)
            return
        if counters is None:
            return
        delta = self.meter.observe(session.id, session.tenant, counters)
        self._metrics.record_egress(
            session.tenant, delta.bytes_sent, delta.bytes_received, delta.refused
        )

    async def round(self, sessions: Iterable[Session]) -> None:
        """Read every live session with a network, then refuse or free each tenant's."""
        networked = [s for s in sessions if s.policy.network.mode != "none" and not s.closed]
        limiter = anyio.CapacityLimiter(READ_CONCURRENCY)

        async def read(session: Session) -> None:
            async with limiter:
                await self._read(session)

        async with anyio.create_task_group() as group:
            for session in networked:
                group.start_soon(read, session)
        for session in networked:
            await self._enforce(session)

    async def _enforce(self, session: Session) -> None:
        limits = self._tenant_config(session.tenant)
        quota = limits.quotas.egress_mb if limits is not None else None
        wanted = QUOTA_RULE if self.meter.over(session.tenant, quota) else None
        if self._refusing.get(session.id) == wanted:
            return
        try:
            await self._backend.set_egress_refusal(session.container_id, wanted)
        except OrchestratorError as exc:
            log.warning("session %s: egress refusal not set: %s", session.id, exc)
            return
        self._refusing[session.id] = wanted
        if wanted is not None:
            used = self.meter.used(session.tenant) / (1024 * 1024)
            log.info(
                "session %s: egress refused, tenant %s moved %.1f of %s MiB this window",
                session.id, session.tenant, used, quota,
            )  # fmt: skip

    async def admit(self, session: Session) -> None:
        """A new session of a tenant over its quota is refused before any of its code runs (a
        round would leave it the time to the next read); no exec for a tenant within it."""
        if session.policy.network.mode != "none":
            limits = self._tenant_config(session.tenant)
            if self.meter.over(session.tenant, limits.quotas.egress_mb if limits else None):
                await self._enforce(session)

    async def final(self, session: Session) -> None:
        """A session's last read, before its proxy goes: the proxy stops moving bytes and its
        totals then count, to the last byte. Bounded; a failure only loses what moved since
        the last round."""
        if session.policy.network.mode != "none":
            with anyio.move_on_after(FINAL_READ_TIMEOUT):
                await self._read(session, final=True)
        self.meter.forget(session.id)
        self._refusing.pop(session.id, None)
