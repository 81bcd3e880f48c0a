"""Tenant quotas: what a tenant may hold at once, checked before anything is created.

Pure: the orchestrator hands in what a tenant holds (its sessions and the creations in flight)
and the policy of the session it asks for; the check raises or returns. The orchestrator runs it
and records the reservation with no await in between, so concurrent creates cannot both pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.errors import PolicyViolationError, QuotaExceededError
from orchestrator.policy import Policy
from orchestrator.tenants import TenantConfig


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
