"""The network of a session with egress, built so that the host is not on it: the sandbox's one
neighbour is its egress proxy. (On an internal bridge the host holds the gateway address, and
what a sandbox sends there, or to any other address of the host through it, is the host's own
input: the bridge's "internal" rules only stop forwarding.)

Two Docker networks per session, labelled like its proxy:

- the **session network** (``network_name``): a ``macvlan`` network in bridge mode whose members
  are the session and its proxy. A macvlan interface reaches its siblings directly; whatever it
  sends to any other address, broadcasts included, leaves through its parent device's transmit
  path and never enters the host's own stack, and the host holds no address on it. Docker gives
  it a gateway address that nobody holds: the session's default route ends there (no answer to
  its ARP: unreachable, or a timeout).
- the **link** (``link_name``): the macvlan's parent device, a bridge network that is
  ``internal`` and gives the host no address on it (``inhibit_ipv4``; Docker turns IPv6 off on
  the containers' side), and whose only member is the proxy. Docker's macvlan needs an existing
  parent and takes each for one network only; a parentless one (``--internal``) needs the
  kernel's dummy link type, which not every kernel has (CI's has not). The proxy joins the link
  because a bridge with no port has no carrier, and a macvlan takes its parent's. What the
  session sends off its network lands there, on the proxy's side, which does not forward
  (``_egress.PROXY_SYSCTLS``).

Invariants: the link is made before the session network and removed after it
(``removal_order``); a pair half made is removed before its error is raised; the upstream
network sorts before the session network by name (``upstream_problem``), because Docker gives
a container on several networks the default route of the first, by name, of those that are not
internal, and the proxy's must lead upstream. With an operator's pool each session takes one
``/28`` of it: the session network its first half, the link its second.
"""

from __future__ import annotations

import contextlib
from typing import Any

import docker

from orchestrator.backend.docker._client import DockerClient
from orchestrator.backend.docker._egress_subnets import create_in_pool, halves
from orchestrator.errors import BackendError, BackendUnavailableError

SESSION_NETWORK_PREFIX = "sandhold-egress-"
LINK_SUFFIX = "-link"
INHIBIT_IPV4 = "com.docker.network.bridge.inhibit_ipv4"


def network_name(session_id: str) -> str:
    return f"{SESSION_NETWORK_PREFIX}{session_id}"


def link_name(session_id: str) -> str:
    return f"{SESSION_NETWORK_PREFIX}{session_id}{LINK_SUFFIX}"


def upstream_problem(name: str) -> str | None:
    """Why a proxy on the upstream network ``name`` and on a session network would not take its
    default route from the upstream one, None when it would."""
    if name < SESSION_NETWORK_PREFIX:
        return None
    return (
        f"the egress upstream network {name!r} sorts after the session networks "
        f"({SESSION_NETWORK_PREFIX}…): Docker would give the proxies their default route from "
        "the session network, which leads nowhere"
    )


UPSTREAM_HINT = (
    "name the upstream network (SANDHOLD_EGRESS_NETWORK) so that it sorts before "
    "'sandhold-egress-', for example 'bridge' or 'egress-out'"
)


def removal_order(networks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Session networks before links: a macvlan goes before its parent device."""
    return sorted(networks, key=lambda net: net.get("Driver") != "macvlan")


def create_pair(sdk: Any, session_id: str, labels: dict[str, str], subnet: str | None) -> None:
    """The link and the session network over it, in a worker thread; both or neither. With a
    ``subnet`` (a pool's ``/28``) each takes one half of it, else the engine's default pools."""
    session_subnet, link_subnet = halves(subnet) if subnet is not None else (None, None)
    link = sdk.networks.create(
        link_name(session_id), driver="bridge", internal=True, labels=labels,
        check_duplicate=True, options={INHIBIT_IPV4: "true"}, ipam=_ipam(link_subnet),
    )  # fmt: skip
    try:
        sdk.networks.create(
            network_name(session_id), driver="macvlan", labels=labels, check_duplicate=True,
            options={"parent": f"br-{link.id[:12]}", "macvlan_mode": "bridge"},
            ipam=_ipam(session_subnet),
        )  # fmt: skip
    except BaseException:
        # Before a retry with another subnet reuses the name; open_egress's clean-up by label
        # removes it if this fails too.
        with contextlib.suppress(docker.errors.APIError):
            link.remove()
        raise


def _ipam(subnet: str | None) -> Any:
    if subnet is None:
        return None
    return docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)])


async def create_networks(
    client: DockerClient, session_id: str, labels: dict[str, str], pool: str | None
) -> None:
    """The session's two networks, from the operator's pool or the engine's defaults."""

    def create(sdk: Any) -> None:
        if pool is None:
            create_pair(sdk, session_id, labels, None)
        else:
            create_in_pool(sdk, pool, lambda subnet: create_pair(sdk, session_id, labels, subnet))

    try:
        await client.call(create)
    except BackendUnavailableError:
        raise
    except BackendError as exc:
        if "non-overlapping" not in str(exc):
            raise
        raise BackendUnavailableError(
            "the engine has no address pool left for another session network (a session with "
            f"a network takes two; Docker's default pools hold about thirty): {exc}",
            hint="set SANDHOLD_EGRESS_SUBNETS to a free private range (a /28 per session), "
            "or default-address-pools in daemon.json",
        ) from exc


__all__ = [
    "SESSION_NETWORK_PREFIX",
    "UPSTREAM_HINT",
    "create_networks",
    "create_pair",
    "link_name",
    "network_name",
    "removal_order",
    "upstream_problem",
]
