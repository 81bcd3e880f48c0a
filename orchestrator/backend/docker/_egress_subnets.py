"""Addresses for the sessions' egress networks from an operator's pool, so that their number is
not capped by the engine's default address pools (Docker's give about thirty networks, each a
/20 or a /16, and a session with egress takes two: ``_egress_net``; its session network holds
four addresses: the gateway nobody holds, the session, its proxy and one spare; its link two).

With ``EgressSettings.subnet_pool`` set, each session gets the pool's first ``SUBNET_PREFIX``
subnet that overlaps no network the engine has, and its two networks one half each
(``halves``). Invariants: one process picks
and creates one network at a time (``_PICKING``), so its own creations never pick the same
subnet; another process (a second orchestrator on the engine) may still pick it first, and the
engine refuses the overlap, which is retried with the next free subnet, at most
``MAX_ATTEMPTS`` times. An exhausted pool is ``backend_unavailable``, said as such.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Final

from orchestrator.backend.docker._client import translate_docker_errors
from orchestrator.errors import BackendError, BackendUnavailableError

# 16 addresses, two halves of 8: each half's network and broadcast addresses and gateway, and on
# the session network the session and its proxy, on the link the proxy.
SUBNET_PREFIX: Final = 28
MAX_ATTEMPTS: Final = 8
_PICKING = threading.Lock()


def free_subnets(pool: str, taken: Iterable[str], prefix: int = SUBNET_PREFIX) -> Iterator[str]:
    """The pool's ``/prefix`` subnets (an IPv4 pool of at least that size: ``check_pool``)
    that overlap none of ``taken`` (the engine's networks' subnets; one that does not parse,
    or of the other IP version, is ignored), in address order."""
    network = ipaddress.ip_network(pool)
    used = []
    for text in taken:
        try:
            used.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            continue
    used = [u for u in used if u.version == network.version and u.overlaps(network)]
    for candidate in network.subnets(new_prefix=prefix):
        if not any(candidate.overlaps(u) for u in used):
            yield str(candidate)


def halves(subnet: str) -> tuple[str, str]:
    """A session's subnet of the pool split in two: (its session network's, its link's)."""
    first, second = ipaddress.ip_network(subnet).subnets(prefixlen_diff=1)
    return str(first), str(second)


def check_pool(pool: str) -> str:
    """``pool`` as a network, or ``ValueError`` saying why it cannot be one."""
    network = ipaddress.ip_network(pool)
    if network.version != 4:
        raise ValueError(f"{pool} is not an IPv4 range (session networks are IPv4)")
    if network.prefixlen > SUBNET_PREFIX:
        raise ValueError(f"{pool} is smaller than one egress network (/{SUBNET_PREFIX})")
    return str(network)


def _engine_subnets(sdk: Any) -> list[str]:
    return [
        str(config["Subnet"])
        for network in sdk.api.networks()
        for config in ((network.get("IPAM") or {}).get("Config") or [])
        if config.get("Subnet")
    ]


def create_in_pool(sdk: Any, pool: str, create: Any) -> str:
    """Run ``create(subnet)`` (it creates the session's networks, all or none) with a free
    subnet of ``pool``, in a worker thread; the subnet it got."""
    with _PICKING:
        for _ in range(MAX_ATTEMPTS):
            subnet = next(free_subnets(pool, _engine_subnets(sdk)), None)
            if subnet is None:
                raise BackendUnavailableError(
                    f"the egress subnet pool {pool} is full: every /{SUBNET_PREFIX} in it is "
                    "taken by a session's network or another network of the engine",
                    hint="end sessions with a network, or widen SANDHOLD_EGRESS_SUBNETS",
                )
            try:
                with translate_docker_errors():
                    create(subnet)
            except BackendError as exc:
                if "overlap" in str(exc).lower():
                    continue  # another process took it between our listing and our create
                raise
            return subnet
    raise BackendUnavailableError(
        f"no subnet of the egress pool {pool} could be taken in {MAX_ATTEMPTS} attempts: "
        "other processes keep taking them first"
    )


__all__ = ["SUBNET_PREFIX", "check_pool", "create_in_pool", "free_subnets", "halves"]
