"""A live change of a session's allowlist, checked against its policy: never wider. Pure.

A new rule is within the policy when one of the policy's rules covers every host and port it
names: an exact host by the same host or a ``*.`` rule above it, a ``*.`` rule by a ``*.`` rule
at or above its domain; its ports (80 and 443 when it names none) among that rule's. Under
``open`` every rule is within; under ``none`` there is nothing to change.
"""

from __future__ import annotations

from collections.abc import Sequence

import pydantic

from orchestrator.errors import InvalidArgumentError, PolicyViolationError
from orchestrator.policy.model import MAX_ALLOW_RULES, NetworkConfig

__all__ = ["narrowed_allowlist"]

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


def narrowed_allowlist(network: NetworkConfig, allow: Sequence[str]) -> list[str]:
    """``allow`` checked (syntax, then within the policy), duplicates dropped, order kept."""
    if network.mode == "none":
        raise PolicyViolationError(
            "the session's policy has network mode none: there is no allowlist to change",
            rule="network.mode",
        )
    try:
        checked = NetworkConfig(mode="allowlist", allow=list(allow)).allow
    except pydantic.ValidationError as exc:
        problem = exc.errors()[0]
        raise InvalidArgumentError(f"allow: {problem['msg']}") from None
    if len(checked) > MAX_ALLOW_RULES:
        raise InvalidArgumentError(f"allow: at most {MAX_ALLOW_RULES} rules")
    if network.mode == "allowlist":
        for rule in checked:
            if not any(_covers(outer, rule) for outer in network.allow):
                raise PolicyViolationError(
                    f"{rule!r} is not within the session's policy allowlist", rule="network.allow"
                )
    return list(dict.fromkeys(checked))
