"""A session's allowlist within its policy's and its tenant's: a live change checked against
both (never wider), and the rules a tenant's cap leaves of a policy's. Pure.

A new rule is within the policy when one of the policy's rules covers every host and port it
names: an exact host by the same host or a ``*.`` rule above it, a ``*.`` rule by a ``*.`` rule
at or above its domain; its ports (80 and 443 when it names none) among that rule's. Under
``open`` every rule is within; under ``none`` there is nothing to change. A tenant's cap
(``egress_allow`` in the tenants file) is a list of rules too, checked the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import pydantic

from orchestrator.errors import InvalidArgumentError, PolicyViolationError
from orchestrator.policy.model import MAX_ALLOW_RULES, NetworkConfig

__all__ = ["capped_allowlist", "check_rules", "narrowed_allowlist"]

DEFAULT_PORTS = frozenset({80, 443})


def _parse(rule: str) -> tuple[str, frozenset[int]]:
    name, _, port = rule.partition(":")
    return name, frozenset({int(port)}) if port else DEFAULT_PORTS


def _covers(outer: str, inner: str) -> bool:
    (outer_name, outer_ports), (inner_name, inner_ports) = _parse(outer), _parse(inner)
    if not inner_ports <= outer_ports:
        return False
    if not outer_name.startswith("*."):
        return inner_name == outer_name
    domain = outer_name[1:]  # ".example.com"
    if inner_name.startswith("*."):
        return inner_name[1:].endswith(domain)
    return inner_name.endswith(domain) and len(inner_name) > len(domain)


def check_rules(allow: Sequence[str]) -> list[str]:
    """``allow`` as rules (a policy's syntax: lower-case names, ``*.`` wildcards, ports), or
    ``ValueError`` naming the first that is not one."""
    try:
        checked = NetworkConfig(mode="allowlist", allow=list(allow)).allow
    except pydantic.ValidationError as exc:
        raise ValueError(exc.errors()[0]["msg"]) from None
    if len(checked) > MAX_ALLOW_RULES:
        raise ValueError(f"at most {MAX_ALLOW_RULES} rules")
    return list(checked)


def narrowed_allowlist(
    network: NetworkConfig, allow: Sequence[str], tenant_allow: Sequence[str] | None = None
) -> list[str]:
    """``allow`` checked (syntax, then within the policy and the tenant's cap ``tenant_allow``,
    None: no cap), duplicates dropped, order kept."""
    if network.mode == "none":
        raise PolicyViolationError(
            "the session's policy has network mode none: there is no allowlist to change",
            rule="network.mode",
        )
    try:
        checked = check_rules(allow)
    except ValueError as exc:
        raise InvalidArgumentError(f"allow: {exc}") from None
    for rule in checked:
        if network.mode == "allowlist" and not any(_covers(o, rule) for o in network.allow):
            raise PolicyViolationError(
                f"{rule!r} is not within the session's policy allowlist", rule="network.allow"
            )
        if tenant_allow is not None and not any(_covers(o, rule) for o in tenant_allow):
            raise PolicyViolationError(
                f"{rule!r} is not within the hosts the session's tenant may reach",
                rule="tenant.egress_allow",
            )
    return list(dict.fromkeys(checked))


def capped_allowlist(
    network: NetworkConfig, tenant_allow: Sequence[str] | None
) -> list[str] | None:
    """The rules a session of this policy gets under its tenant's cap: every policy rule the
    cap covers, and every cap rule the policy covers (a narrower name or fewer ports); for an
    ``open`` policy, the cap itself. None: no cap applies (none set, or mode ``none``)."""
    if tenant_allow is None or network.mode == "none":
        return None
    if network.mode == "open":
        return list(dict.fromkeys(tenant_allow))
    both = [rule for rule in network.allow if any(_covers(t, rule) for t in tenant_allow)]
    both += [rule for rule in tenant_allow if any(_covers(p, rule) for p in network.allow)]
    both = list(dict.fromkeys(both))
    # A rule another one covers adds nothing: the list stays as short as what it allows.
    return [r for r in both if not any(o != r and _covers(o, r) for o in both)]
