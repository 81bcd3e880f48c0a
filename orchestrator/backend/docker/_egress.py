"""Egress for sessions whose policy has a network: a network of their own on which the host is
not and the only other member is an egress proxy container (``worker/egress_proxy.py`` from the
session's image), also attached to the upstream network (``_egress_net`` says how the network is
built). The session container joins only its network and gets ``HTTP(S)_PROXY`` naming the
proxy's address there with a per-session credential: that address is all it can reach.

Invariants: the networks and the proxy carry ``LABEL_EGRESS_SESSION`` (and the orchestrator's id
and the spec's extra labels), so ``remove_egress`` finds them by the session id and
``reap_egress`` finds those whose session container is gone; a failed ``open_egress`` leaves
nothing behind. The proxy's settings are the orchestrator's (the policy's rules and limits, the
operator's ``EgressSettings``), never the sandbox's.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio

from orchestrator.backend.base import LABEL_SESSION, SANDBOX_UID
from orchestrator.backend.docker._client import DockerClient
from orchestrator.backend.docker._egress_net import (
    UPSTREAM_HINT,
    create_networks,
    link_name,
    network_name,
    removal_order,
    upstream_problem,
)
from orchestrator.backend.docker._egress_subnets import check_pool
from orchestrator.backend.docker._seccomp import profile_json
from orchestrator.errors import BackendUnavailableError, InvalidArgumentError

if TYPE_CHECKING:
    from orchestrator.backend.base import ContainerSpec

LABEL_EGRESS_SESSION = "sandhold.egress-session"
LABEL_EGRESS_ORCHESTRATOR = "sandhold.egress-orchestrator"
PROXY_PORT = 3128
PROXY_LOG = "/tmp/egress-log.jsonl"  # noqa: S108 (a path inside the proxy container)
PROXY_ALLOW = "/tmp/egress-allow.json"  # noqa: S108 (a live allowlist, written whole)
PROXY_STATS = "/tmp/egress-stats.json"  # noqa: S108 (the proxy's totals, written whole)
PROXY_REFUSE = "/tmp/egress-refuse.json"  # noqa: S108 (a refusal of everything, e.g. a quota)
PROXY_CONTROL = "/tmp/egress-control.sock"  # noqa: S108 (reached by an exec, never the sandbox)
# Run inside the proxy's container at a session's end: ask the proxy (its control socket) to end
# its accounting and print the totals it answers, which count every byte it moved; the file it
# rewrites each second would miss what moved since. Exits 1 when the proxy gives no answer.
PROXY_FINAL = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.settimeout(float(sys.argv[2]))\n"
    "s.connect(sys.argv[1])\n"
    "s.sendall(b'final\\n')\n"
    "data = b''\n"
    "while not data.endswith(b'\\n'):\n"
    "    chunk = s.recv(65536)\n"
    "    if not chunk:\n"
    "        sys.exit(1)\n"
    "    data += chunk\n"
    "sys.stdout.buffer.write(data)\n"
)
PROXY_COMMAND = ["python3", "-I", "/opt/sandhold/worker/egress_proxy.py"]
MIB = 1024 * 1024
# The proxy is a small asyncio server: this holds it with room for a few hundred connections.
PROXY_MEMORY_MB = 96
PROXY_PIDS = 32
# The proxy sits on the session's network and its link (``_egress_net``) and on the upstream one:
# it relays connections, it never routes a packet from one to another.
PROXY_SYSCTLS = {"net.ipv4.ip_forward": "0", "net.ipv4.conf.all.forwarding": "0"}
# Another orchestrator's proxy without a session container is left this long: its creation may
# be in flight (a network, then the proxy, then the session container, in well under this).
STRAY_GRACE_S = 600.0
# Removing a proxy is a SIGKILL and cleanup; a network removal is quicker still.
REMOVE_TIMEOUT = 30.0


@dataclass(frozen=True, kw_only=True)
class EgressSettings:
    """The operator's egress settings, never a tenant's: the network the proxies reach the world
    on; the address range the sessions' internal networks are carved from (``/28`` each, see
    ``_egress_subnets``; None: the engine's default pools, about thirty networks with Docker's
    defaults); and address ranges the proxies may connect to despite being private (for tests
    that build their own "internet" on a Docker network; empty in any real deployment). The
    upstream network's name sorts before ``sandhold-egress-`` (``upstream_problem``)."""

    upstream_network: str = "bridge"
    subnet_pool: str | None = None
    permit_cidrs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (problem := upstream_problem(self.upstream_network)) is not None:
            raise InvalidArgumentError(problem, hint=UPSTREAM_HINT)
        if self.subnet_pool is not None:
            try:
                check_pool(self.subnet_pool)
            except ValueError as exc:
                raise InvalidArgumentError(f"egress subnet pool: {exc}") from None

    @classmethod
    def from_env(cls) -> EgressSettings:
        """``SANDHOLD_EGRESS_NETWORK`` (the proxies' upstream network, default ``bridge``) and
        ``SANDHOLD_EGRESS_SUBNETS`` (the pool, e.g. ``10.213.0.0/16``: 4096 sessions)."""
        return cls(
            upstream_network=os.environ.get("SANDHOLD_EGRESS_NETWORK") or "bridge",
            subnet_pool=os.environ.get("SANDHOLD_EGRESS_SUBNETS") or None,
        )


@dataclass(frozen=True)
class Egress:
    network: str
    proxy_id: str
    proxy_address: str
    token: str

    def session_env(self) -> dict[str, str]:
        url = f"http://sandbox:{self.token}@{self.proxy_address}:{PROXY_PORT}"
        no_proxy = "localhost,127.0.0.1,::1"
        return {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": no_proxy,
            "no_proxy": no_proxy,
        }


def _labels(spec: ContainerSpec) -> dict[str, str]:
    return {
        **spec.extra_labels,
        LABEL_EGRESS_SESSION: spec.session_id,
        LABEL_EGRESS_ORCHESTRATOR: spec.orchestrator_id,
    }


def proxy_config(spec: ContainerSpec, token: str, settings: EgressSettings) -> dict[str, Any]:
    net = spec.policy.network
    return {
        "token": token,
        "mode": net.mode,
        "allow": list(net.allow),
        "permit_cidrs": list(settings.permit_cidrs),
        "max_connections": net.max_connections,
        "max_bytes": net.max_mb * MIB,
        "idle_timeout": net.idle_timeout_s,
        "max_connection": net.max_connection_s,
        "log_path": PROXY_LOG,
        "allow_path": PROXY_ALLOW,
        "stats_path": PROXY_STATS,
        "refuse_path": PROXY_REFUSE,
        "control_path": PROXY_CONTROL,
    }


def proxy_kwargs(spec: ContainerSpec, token: str, settings: EgressSettings) -> dict[str, Any]:
    """The proxy container: hardened like a session (it parses what a sandbox sends)."""
    return {
        "image": spec.image,
        "command": PROXY_COMMAND,
        "user": f"{SANDBOX_UID}:{SANDBOX_UID}",
        "environment": {"SANDHOLD_EGRESS_CONFIG": json.dumps(proxy_config(spec, token, settings))},
        "labels": _labels(spec),
        "detach": True,
        "network": network_name(spec.session_id),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true", f"seccomp={profile_json()}"],
        "read_only": True,
        "tmpfs": {"/tmp": "rw,nosuid,nodev,size=4m,mode=1777"},  # noqa: S108
        "mem_limit": PROXY_MEMORY_MB * MIB,
        "memswap_limit": PROXY_MEMORY_MB * MIB,
        "nano_cpus": int(0.5e9),
        "pids_limit": PROXY_PIDS,
        "sysctls": PROXY_SYSCTLS,
        "init": True,
        "restart_policy": {"Name": "no"},
        "log_config": {"Type": "none", "Config": {}},
    }


async def open_egress(
    client: DockerClient, spec: ContainerSpec, settings: EgressSettings
) -> Egress:
    """The session's networks and its running proxy; nothing is left on failure."""
    token = secrets.token_urlsafe(24)
    name = network_name(spec.session_id)
    try:
        await create_networks(client, spec.session_id, _labels(spec), settings.subnet_pool)
        kwargs = proxy_kwargs(spec, token, settings)
        proxy = await client.call(lambda sdk: sdk.containers.create(**kwargs))
        await client.call(_connect_proxy, proxy.id, spec.session_id, settings.upstream_network)
        await client.call(lambda _sdk: proxy.start())
        info = await client.call(lambda sdk: sdk.api.inspect_container(proxy.id))
        address = info["NetworkSettings"]["Networks"][name]["IPAddress"]
        if not address:
            raise RuntimeError("the egress proxy has no address on its session network")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await remove_egress(client, spec.session_id)
        raise
    return Egress(network=name, proxy_id=str(proxy.id), proxy_address=address, token=token)


def _connect_proxy(sdk: Any, proxy_id: str, session_id: str, upstream: str) -> None:
    sdk.networks.get(link_name(session_id)).connect(proxy_id)
    network = sdk.networks.get(upstream)
    if (problem := upstream_problem(network.name)) is not None:  # ``upstream`` may be an id
        raise BackendUnavailableError(problem, hint=UPSTREAM_HINT)
    network.connect(proxy_id)


async def remove_egress(client: DockerClient, session_id: str) -> None:
    """Remove the session's proxy and networks; what is already gone is not an error."""
    label = f"{LABEL_EGRESS_SESSION}={session_id}"

    def remove(sdk: Any) -> None:
        for found in sdk.api.containers(all=True, quiet=True, filters={"label": label}):
            _ignore_gone(sdk.api.remove_container, found["Id"], force=True, v=True)
        for net in removal_order(sdk.api.networks(filters={"label": label})):
            _ignore_gone(sdk.api.remove_network, net["Id"])

    with anyio.fail_after(REMOVE_TIMEOUT):
        await client.call(remove)


def _ignore_gone(action: Any, *args: Any, **kwargs: Any) -> None:
    try:
        action(*args, **kwargs)
    except Exception as exc:
        if getattr(exc, "status_code", None) not in (404, 409):
            raise


async def reap_egress(client: DockerClient, orchestrator_id: str, keep: set[str]) -> list[str]:
    """Remove the proxies and networks whose session container is gone: this orchestrator's
    unless their session is in ``keep`` (being created), another's once past the grace."""

    def stray(sdk: Any) -> set[str]:
        sessions = {
            c["Labels"].get(LABEL_SESSION)
            for c in sdk.api.containers(all=True, filters={"label": LABEL_SESSION})
        }
        found: set[str] = set()
        now = time.time()
        proxies = sdk.api.containers(all=True, filters={"label": LABEL_EGRESS_SESSION})
        # A network whose proxy is gone too (a run killed between the two removals) is found
        # by its own labels; its age is the engine's RFC 3339 time, to the second.
        networks = sdk.api.networks(filters={"label": LABEL_EGRESS_SESSION})
        for item, created in [
            *((p, float(p.get("Created", now))) for p in proxies),
            *((n, _created(n.get("Created", ""), now)) for n in networks),
        ]:
            labels = item.get("Labels") or {}
            session = labels.get(LABEL_EGRESS_SESSION, "")
            if session in sessions or session in keep:
                continue
            mine = labels.get(LABEL_EGRESS_ORCHESTRATOR) == orchestrator_id
            if mine or now - created > STRAY_GRACE_S:
                found.add(session)
        return found

    sessions = await client.call(stray)
    for session in sessions:
        await remove_egress(client, session)
    return sorted(sessions)


def _created(text: str, default: float) -> float:
    try:
        return datetime.fromisoformat(text[:19]).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return default


__all__ = [
    "LABEL_EGRESS_ORCHESTRATOR",
    "LABEL_EGRESS_SESSION",
    "PROXY_ALLOW",
    "PROXY_CONTROL",
    "PROXY_FINAL",
    "PROXY_REFUSE",
    "PROXY_STATS",
    "Egress",
    "EgressSettings",
    "network_name",
    "open_egress",
    "reap_egress",
    "remove_egress",
]
