"""E2B's network options (``allow_internet_access``, snake_case on E2B's wire too, and
``network`` of a create) onto sandhold's egress: a policy's ``[network]`` mode and a session's
live allowlist (``session set_allowlist``, docs/egress.md).

sandhold allows by host name, through a proxy outside the sandbox; it never widens what the
sandbox's policy (and its tenant's cap) allows. So:

- ``allow_internet_access: false``, or ``denyOut`` holding all traffic (``0.0.0.0/0``) and no
  ``allowOut``: no egress at all (the allowlist emptied; a policy of mode ``none`` has none).
- ``allowOut`` of host names (with ``denyOut`` all traffic, or alone): the session reaches those
  names only, each within the policy's allowlist; a policy of mode ``none`` refuses it
  (``policy``, rule ``network.mode``). Alone, E2B would let everything else through too; here
  the list is all the sandbox reaches (narrower, never wider).
- ``allow_internet_access: true`` (E2B's default, which older SDKs such as 2.45.1 always send)
  and no ``network``: what the policy gives, unchanged.
- What cannot be honoured is refused before the sandbox is handed out, never ignored: an IP
  address or CIDR in ``allowOut`` (the proxy matches names, and refuses private addresses
  anyway), ``denyOut`` of anything but all traffic (there is no deny-list in an allow-by-name
  proxy), ``allowOut`` with ``allow_internet_access: false``, DNS servers, per-host transform
  rules, an egress proxy of the caller's, HTTPS ports and a host mask (ingress sandhold does
  not serve). ``allowPublicTraffic`` is accepted either way: a sandbox's services are reached
  only with its access token, whatever it says.

Refusals are ``invalid_argument`` (a shape sandhold cannot express: 400) or ``policy`` (the
policy does not allow it: 403), each answered before the sandbox is returned; the session made
for it is destroyed."""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass
from typing import Any, Final

from starlette.responses import Response

from orchestrator.errors import InvalidArgumentError
from orchestrator.http.e2b._errors import e2b_error, status_of
from orchestrator.http.e2b._tooling import ToolCallError, call

__all__ = ["ALL_TRAFFIC", "EgressPlan", "apply_network", "egress_plan"]

ALL_TRAFFIC: Final = "0.0.0.0/0"
# The most entries a list may hold: the policy's own bound on allow rules.
MAX_RULES: Final = 256
# Options that widen or redirect traffic in ways sandhold does not offer.
_UNSUPPORTED: Final = {
    "rules": "per-host transform rules",
    "egressProxy": "an egress proxy of the caller's",
    "maskRequestHost": "a host mask for sandbox URLs",
    "httpsPorts": "HTTPS ports for sandbox URLs",
}


@dataclass(frozen=True)
class EgressPlan:
    """What the session's egress becomes: ``allow`` None keeps the policy's; a list (empty:
    nothing) replaces the allowlist within it."""

    allow: list[str] | None


def _strings(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgumentError(f"network.{name} must be a list of strings")
    if len(value) > MAX_RULES:
        raise InvalidArgumentError(f"network.{name} holds more than {MAX_RULES} entries")
    return [v.strip() for v in value]


def _is_address(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


def egress_plan(body: dict[str, Any]) -> EgressPlan:
    """The plan for a create's ``allow_internet_access`` and ``network``; ``InvalidArgumentError``
    for what sandhold cannot honour (the message says which option and why)."""
    internet = body.get("allow_internet_access")
    if internet is not None and not isinstance(internet, bool):
        raise InvalidArgumentError("allow_internet_access must be true or false")
    network = body.get("network")
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise InvalidArgumentError("network must be an object")
    for key, what in _UNSUPPORTED.items():
        if network.get(key):
            raise InvalidArgumentError(f"network.{key}: {what} is not supported by sandhold")
    if _strings(network.get("dnsServers"), "dnsServers"):
        raise InvalidArgumentError(
            "network.dnsServers: a sandbox resolves no names itself (its proxy does), so no "
            "DNS server can be opened to it"
        )
    public = network.get("allowPublicTraffic")
    if public is not None and not isinstance(public, bool):
        raise InvalidArgumentError("network.allowPublicTraffic must be true or false")
    allow = _strings(network.get("allowOut"), "allowOut")
    deny = _strings(network.get("denyOut"), "denyOut")
    addresses = [entry for entry in allow if _is_address(entry)]
    if addresses:
        raise InvalidArgumentError(
            f"network.allowOut: {addresses[0]!r} is an IP address or CIDR; sandhold allows "
            "egress by host name only"
        )
    others = [entry for entry in deny if entry != ALL_TRAFFIC]
    if others:
        raise InvalidArgumentError(
            f"network.denyOut: {others[0]!r} cannot be denied alone; sandhold allows by host "
            f"name, so denyOut may only be {ALL_TRAFFIC!r} (all traffic), with the names to "
            "reach in allowOut"
        )
    if internet is False and allow:
        raise InvalidArgumentError(
            "allow_internet_access is false but network.allowOut names hosts: say one or the other"
        )
    if allow:
        return EgressPlan(allow=list(dict.fromkeys(allow)))
    if internet is False or deny:
        return EgressPlan(allow=[])
    return EgressPlan(allow=None)


async def apply_network(
    orchestrator: Any, tenant: str, session_id: str, policy: str, body: dict[str, Any]
) -> Response | None:
    """The create's network options applied to its new session before the sandbox is handed
    out; None when done, else the refusal, with the session destroyed (nothing of the caller's
    has run in it)."""
    try:
        plan = egress_plan(body)
        if plan.allow is None:
            return None
        mode = orchestrator.policy(policy).network.mode
        if mode == "none" and not plan.allow:
            return None  # no network at all already
        await call(
            orchestrator,
            tenant,
            "session",
            "set_allowlist",
            session_id=session_id,
            allow=plan.allow,
        )
    except InvalidArgumentError as exc:
        refusal = e2b_error(400, f"invalid_argument: {exc}")
    except ToolCallError as exc:
        refusal = e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
    else:
        return None
    with contextlib.suppress(ToolCallError):  # already gone: nothing to release
        await call(orchestrator, tenant, "python_repl", "destroy", session_id=session_id)
    return refusal
