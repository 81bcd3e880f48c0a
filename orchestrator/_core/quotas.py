"""Tenant quotas: what a tenant may hold at once, checked before anything is created.

Pure: the orchestrator hands in what a tenant holds (its sessions and the creations in flight)
and the policy of the session it asks for; the check raises or returns. The orchestrator runs it
and records the reservation with no await in between, so concurrent creates cannot both pass.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from orchestrator._core.tenants import TenantConfig
from orchestrator.errors import PolicyViolationError, QuotaExceededError
from orchestrator.policy.model import Policy
from orchestrator.session.session import Session


@dataclass(frozen=True)
class Usage:
    sessions: int
    memory_mb: int
    cpus: float


def usage_of(policies: Iterable[Policy]) -> Usage:
    held = list(policies)
    return Usage(
        sessions=len(held),
        memory_mb=sum(p.resources.memory_mb for p in held),
        cpus=round(sum(p.resources.cpus for p in held), 6),
    )


def check_policy_allowed(tenant: TenantConfig | None, policy: Policy) -> None:
    if tenant is not None and tenant.policies is not None and policy.name not in tenant.policies:
        allowed = ", ".join(tenant.policies) or "none"
        raise PolicyViolationError(
            f"tenant {tenant.name} may not use policy {policy.name!r} (allowed: {allowed})",
            rule="tenant.policies",
        )


def check_room(tenant: TenantConfig | None, usage: Usage, policy: Policy) -> None:
    """Raise ``quota_exceeded`` naming the first quota one more session of ``policy`` breaks."""
    if tenant is None:
        return
    quotas = tenant.quotas
    if quotas.sessions is not None and usage.sessions + 1 > quotas.sessions:
        raise QuotaExceededError(
            f"sessions: tenant {tenant.name} has {usage.sessions} of {quotas.sessions} sessions",
            quota="sessions",
            hint="destroy a session first",
        )
    memory = usage.memory_mb + policy.resources.memory_mb
    if quotas.memory_mb is not None and memory > quotas.memory_mb:
        raise QuotaExceededError(
            f"memory_mb: {policy.resources.memory_mb} MiB more would make {memory} MiB, over "
            f"tenant {tenant.name}'s {quotas.memory_mb} MiB",
            quota="memory_mb",
        )
    cpus = round(usage.cpus + policy.resources.cpus, 6)
    if quotas.cpus is not None and cpus > quotas.cpus:
        raise QuotaExceededError(
            f"cpus: {policy.resources.cpus} more would make {cpus}, over tenant "
            f"{tenant.name}'s {quotas.cpus}",
            quota="cpus",
        )


def per_session_cap(tenant: TenantConfig | None, quota: str) -> int | None:
    """The tenant's own cap on ``terminals_per_session`` or ``processes_per_session``."""
    if tenant is None:
        return None
    value = getattr(tenant.quotas, quota)
    return value if isinstance(value, int) else None


def apply_tenant_caps(session: Session, tenant: TenantConfig | None) -> None:
    """The tenant's per-session caps on the session's terminals and background processes."""
    session.terminals.tenant_cap = per_session_cap(tenant, "terminals_per_session")
    session.processes.tenant_cap = per_session_cap(tenant, "processes_per_session")


@dataclass
class Admission:
    """Places held by creations in flight, so every limit counts them: the orchestrator's
    ``max_sessions``, the policy's ``max_sessions_per_owner`` and the tenant's quotas."""

    max_sessions: int
    _held: dict[int, tuple[str, str | None, Policy]] = field(default_factory=dict)
    _tokens: itertools.count[int] = field(default_factory=itertools.count)

    def __len__(self) -> int:
        return len(self._held)

    def reserve(
        self,
        sessions: Iterable[Session],
        *,
        tenant: str,
        task: str | None,
        policy: Policy,
        limits: TenantConfig | None,
    ) -> int:
        """Check every limit against ``sessions`` plus the places held, the caller's own
        quotas first, and hold one more; returns the token to ``release``. Synchronous: nothing
        can slip in between."""
        live = list(sessions)
        self.check_owner(live, tenant=tenant, task=task, policy=policy, limits=limits)
        if len(live) + len(self._held) >= self.max_sessions:
            raise QuotaExceededError(
                f"max_sessions: {self.max_sessions} sessions exist and none of yours is idle",
                quota="max_sessions",
            )
        token = next(self._tokens)
        self._held[token] = (tenant, task, policy)
        return token

    def check_owner(
        self,
        live: list[Session],
        *,
        tenant: str,
        task: str | None,
        policy: Policy,
        limits: TenantConfig | None,
    ) -> None:
        """The caller's own quotas (the tenant's and the per-owner limit), whatever the
        orchestrator's capacity: checked before anything is evicted to make room."""
        held = [s.policy for s in live if s.tenant == tenant]
        held += [p for t, _, p in self._held.values() if t == tenant]
        check_room(limits, usage_of(held), policy)
        owners = [(s.tenant, s.task) for s in live]
        owners += [(t, k) for t, k, _ in self._held.values()]
        limit = policy.limits.max_sessions_per_owner
        if owners.count((tenant, task)) >= limit:
            raise QuotaExceededError(
                f"max_sessions_per_owner: {limit} sessions already open",
                quota="max_sessions_per_owner",
            )

    def release(self, token: int) -> None:
        del self._held[token]

    def starting(self, tenant: str, task: str | None) -> int:
        return sum(1 for t, k, _ in self._held.values() if (t, k) == (tenant, task))
