"""Tenant quotas: what a tenant holds is summed, one more session past a quota is refused as
``quota_exceeded`` naming that quota, a tenant may be held to listed policies, and a tenant
without a config (or without a key) has no limit of its own."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from orchestrator._core.quotas import (
    Usage,
    check_policy_allowed,
    check_room,
    per_session_cap,
    usage_of,
)
from orchestrator._core.tenants import TenantConfig, TenantQuotas, hash_key, new_key
from orchestrator.errors import PolicyViolationError, QuotaExceededError
from orchestrator.policy.model import Policy, load_policy


def policy(memory_mb: int = 512, cpus: float = 1.0, name: str | None = None) -> Policy:
    base = load_policy("default")
    resources = base.resources.model_copy(update={"memory_mb": memory_mb, "cpus": cpus})
    update: dict[str, object] = {"resources": resources}
    if name is not None:
        update["name"] = name
    return base.model_copy(update=update)


def tenant(
    quotas: Mapping[str, float] | None = None, *, policies: tuple[str, ...] | None = None
) -> TenantConfig:
    return TenantConfig(
        name="team-a",
        key_sha256=hash_key(new_key()),
        policies=policies,
        quotas=TenantQuotas.model_validate(quotas or {}),
    )


# -- usage ------------------------------------------------------------------------------------


def test_usage_sums_sessions_memory_and_cpus() -> None:
    usage = usage_of([policy(256, 0.5), policy(1024, 2.0)])
    assert usage == Usage(sessions=2, memory_mb=1280, cpus=2.5)


def test_usage_of_nothing_is_zero() -> None:
    assert usage_of([]) == Usage(sessions=0, memory_mb=0, cpus=0)


def test_usage_accepts_a_one_shot_iterable() -> None:
    assert usage_of(iter([policy(), policy()])).sessions == 2


def test_fractional_cpus_add_up_without_float_drift() -> None:
    usage = usage_of([policy(cpus=0.1), policy(cpus=0.2)])
    assert usage.cpus == 0.3
    check_room(tenant({"cpus": 0.4}), usage, policy(cpus=0.1))


# -- room for one more session ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("quotas", "held", "asked"),
    [
        ({"sessions": 2}, [policy(), policy()], policy()),
        ({"sessions": 0}, [], policy()),
        ({"memory_mb": 1024}, [policy(memory_mb=768)], policy(memory_mb=512)),
        ({"cpus": 2.0}, [policy(cpus=1.5)], policy(cpus=1.0)),
        ({"cpus": 0.5}, [], policy(cpus=1.0)),
    ],
    ids=["sessions", "sessions-zero", "memory_mb", "cpus", "cpus-first-session"],
)
def test_one_session_too_many_is_refused_naming_the_quota(
    quotas: dict[str, int | float], held: list[Policy], asked: Policy
) -> None:
    with pytest.raises(QuotaExceededError) as caught:
        check_room(tenant(quotas), usage_of(held), asked)
    (name,) = quotas
    assert caught.value.quota == name
    assert caught.value.to_dict()["error_type"] == "quota_exceeded"
    assert caught.value.to_dict()["quota"] == name


@pytest.mark.parametrize(
    ("quotas", "held", "asked"),
    [
        ({"sessions": 2}, [policy()], policy()),
        ({"memory_mb": 1024}, [policy(memory_mb=512)], policy(memory_mb=512)),
        ({"cpus": 2.0}, [policy(cpus=1.0)], policy(cpus=1.0)),
    ],
    ids=["sessions", "memory_mb", "cpus"],
)
def test_a_session_that_reaches_a_quota_exactly_is_allowed(
    quotas: dict[str, int | float], held: list[Policy], asked: Policy
) -> None:
    check_room(tenant(quotas), usage_of(held), asked)


def test_the_sessions_quota_is_checked_first() -> None:
    many = usage_of([policy(memory_mb=4096, cpus=8.0)] * 3)
    with pytest.raises(QuotaExceededError) as caught:
        check_room(tenant({"sessions": 3, "memory_mb": 1024, "cpus": 1.0}), many, policy())
    assert caught.value.quota == "sessions"


def test_a_tenant_without_quotas_has_no_limit() -> None:
    huge = usage_of([policy(memory_mb=65536, cpus=64.0)] * 100)
    check_room(tenant(), huge, policy(memory_mb=65536, cpus=64.0))


def test_no_tenant_config_means_no_limit() -> None:
    huge = usage_of([policy(memory_mb=65536, cpus=64.0)] * 100)
    check_room(None, huge, policy())
    check_policy_allowed(None, policy(name="anything"))
    assert per_session_cap(None, "terminals_per_session") is None


# -- policies a tenant may use -----------------------------------------------------------------


def test_a_policy_outside_the_tenants_list_is_refused_naming_the_rule() -> None:
    with pytest.raises(PolicyViolationError) as caught:
        check_policy_allowed(tenant(policies=("strict",)), policy(name="default"))
    assert caught.value.rule == "tenant.policies"
    assert caught.value.to_dict()["error_type"] == "policy"
    assert caught.value.to_dict()["rule"] == "tenant.policies"


def test_a_listed_policy_is_allowed() -> None:
    check_policy_allowed(tenant(policies=("strict", "default")), policy(name="default"))


def test_a_tenant_without_a_policy_list_may_use_any_policy() -> None:
    check_policy_allowed(tenant(), policy(name="anything"))


def test_an_empty_policy_list_allows_no_policy() -> None:
    with pytest.raises(PolicyViolationError):
        check_policy_allowed(tenant(policies=()), policy())


# -- caps inside one session -------------------------------------------------------------------


def test_per_session_caps_come_from_the_tenants_quotas() -> None:
    config = tenant({"terminals_per_session": 4, "processes_per_session": 0})
    assert per_session_cap(config, "terminals_per_session") == 4
    assert per_session_cap(config, "processes_per_session") == 0


def test_an_unset_per_session_cap_is_no_cap() -> None:
    assert per_session_cap(tenant(), "terminals_per_session") is None
    assert per_session_cap(tenant(), "processes_per_session") is None
