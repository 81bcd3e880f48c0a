"""A session with a network reaches nothing but its own proxy: not the host, on any of its
addresses, as an attacker inside the sandbox would try it (``socket.create_connection`` and UDP,
no proxy), under runc and runsc.

The test listens on every address the host holds once the session is up (``ip -j addr``: every
interface's IPv4 and IPv6 addresses, link-local ones with their scope, so each bridge gateway,
docker0's and the session network's if the host held one), with a TCP and a UDP socket on each
and a TCP and a UDP socket on the wildcard addresses; then, from inside, it connects to each
address on its own port and on the wildcard port, and sends a datagram to each and to the
broadcast and all-hosts addresses. Every connection must time out or be unroutable: one that is
accepted, or refused (a refusal is the host's kernel answering), fails the test, and afterwards
no listener may hold a connection or a datagram. The session network's gateways and the proxy's
addresses on its other networks are tried as well (no listener there: nothing of the host's).

Loopback (127.0.0.0/8, ::1) is listened on but not connected to: inside the session those
addresses are the session's own loopback (its own network namespace, under runsc gVisor's own
stack), so a connection to them never leaves the sandbox and a refusal there is the sandbox's own
kernel, not the host's; the host's loopback listeners must still see nothing.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import docker
import pytest

from orchestrator.backend.base import ExecSpec
from tests.docker.test_egress import (
    _egress_of,
    egress_backend,
    internet,
    runtime,
    sandbox,
)

__all__ = ["egress_backend", "internet", "runtime", "sandbox"]  # the fixtures, from test_egress

pytestmark = pytest.mark.anyio

# What the sandbox waits on each connection: a route that exists answers within milliseconds,
# an ARP that nobody answers gives up after about a second.
CONNECT_TIMEOUT_S = 1.5
# The probe runs its connections this many at a time (threads count against the pids limit).
PROBE_THREADS = 16
PROXY_PORT = 3128
# Outcomes that mean the host was never reached: no answer, or no route from the sandbox.
UNREACHED = {"timeout", "EHOSTUNREACH", "ENETUNREACH"}
# And for an IPv6 address: the sandbox has no IPv6 address to send from (Docker turns IPv6 off on
# an interface of a network without it), so nothing left the sandbox.
UNREACHED_IPV6 = {*UNREACHED, "EADDRNOTAVAIL"}
IP_FREEBIND, IPV6_FREEBIND = 15, 78  # <linux/in.h>, <linux/in6.h>

PROBE = r"""
import concurrent.futures, errno, json, socket, sys
targets, udp_targets, timeout, threads = json.loads(sys.argv[1])
link = next(name for _, name in socket.if_nameindex() if name != "lo")

def address(host):
    return f"{host}%{link}" if host.startswith("fe80:") else host

for host, port in udp_targets:  # datagrams first: they have arrived when the connects are done
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        try:
            udp.sendto(b"sandhold-host-reach", (address(host), port))
        except OSError:
            pass

def connect(target):
    host, port = target
    try:
        socket.create_connection((address(host), port), timeout=timeout).close()
        return "accepted"
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    print(json.dumps(list(pool.map(connect, [tuple(t) for t in targets]))))
"""


@dataclass(frozen=True)
class HostAddress:
    interface: str
    index: int
    address: str

    @property
    def family(self) -> socket.AddressFamily:
        return socket.AF_INET6 if ":" in self.address else socket.AF_INET

    def sockaddr(self, port: int) -> tuple[Any, ...]:
        if self.family == socket.AF_INET:
            return (self.address, port)
        scope = self.index if ipaddress.ip_address(self.address).is_link_local else 0
        return (self.address, port, 0, scope)

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback


def host_addresses() -> list[HostAddress]:
    """Every address of every interface of the host, as the kernel lists them now."""
    listed = json.loads(
        subprocess.run(["ip", "-j", "addr"], check=True, capture_output=True, timeout=30).stdout
    )
    return [
        HostAddress(link["ifname"], int(link["ifindex"]), info["local"])
        for link in listed
        for info in link.get("addr_info", [])
        if info.get("family") in ("inet", "inet6")
    ]


def _bound(family: socket.AddressFamily, kind: int, sockaddr: tuple[Any, ...]) -> socket.socket:
    sock = socket.socket(family, kind)
    # An IPv6 address still in duplicate address detection cannot be bound otherwise.
    if family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
    else:
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FREEBIND, 1)
    if family == socket.AF_INET6 and sockaddr[0] == "::":
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too
    sock.bind(sockaddr)
    if kind == socket.SOCK_STREAM:
        sock.listen(16)
    sock.setblocking(False)
    return sock


@dataclass
class Listeners:
    """A TCP and a UDP socket on each host address and on the wildcard, each on a free port."""

    tcp: dict[str, socket.socket]
    udp: dict[str, socket.socket]
    wildcard_tcp: socket.socket
    wildcard_udp: socket.socket

    def port(self, sock: socket.socket) -> int:
        return int(sock.getsockname()[1])

    def heard(self) -> list[str]:
        """What reached any listener: accepted connections and datagrams, by address."""
        found = []
        for name, sock in [*self.tcp.items(), ("wildcard", self.wildcard_tcp)]:
            try:
                conn, peer = sock.accept()
            except BlockingIOError:
                continue
            conn.close()
            found.append(f"tcp {name} from {peer}")
        for name, sock in [*self.udp.items(), ("wildcard", self.wildcard_udp)]:
            try:
                _, peer = sock.recvfrom(512)
            except BlockingIOError:
                continue
            found.append(f"udp {name} from {peer}")
        return found


@pytest.fixture
def listen() -> Iterator[Any]:
    opened: list[socket.socket] = []

    def make(addresses: list[HostAddress]) -> Listeners:
        def bound(family: socket.AddressFamily, kind: int, addr: tuple[Any, ...]) -> socket.socket:
            opened.append(_bound(family, kind, addr))
            return opened[-1]

        return Listeners(
            tcp={a.address: bound(a.family, socket.SOCK_STREAM, a.sockaddr(0)) for a in addresses},
            udp={a.address: bound(a.family, socket.SOCK_DGRAM, a.sockaddr(0)) for a in addresses},
            wildcard_tcp=bound(socket.AF_INET6, socket.SOCK_STREAM, ("::", 0, 0, 0)),
            wildcard_udp=bound(socket.AF_INET6, socket.SOCK_DGRAM, ("::", 0, 0, 0)),
        )

    try:
        yield make
    finally:
        for sock in opened:
            sock.close()


def _networks_of(container_id: str) -> dict[str, Any]:
    sdk = docker.from_env(timeout=30)
    try:
        return dict(sdk.api.inspect_container(container_id)["NetworkSettings"]["Networks"])
    finally:
        sdk.close()


def _gateways(session_id: str) -> list[str]:
    """The gateways Docker's address management gave the session's networks (held by the host
    on a bridge network, by nobody on a macvlan one or a bridge without a host address)."""
    sdk = docker.from_env(timeout=30)
    try:
        networks = sdk.api.networks(filters={"label": f"sandhold.egress-session={session_id}"})
        return [
            str(config["Gateway"])
            for net in networks
            for config in (sdk.api.inspect_network(net["Id"])["IPAM"]["Config"] or [])
            if config.get("Gateway")
        ]
    finally:
        sdk.close()


async def test_a_session_reaches_no_host_address_only_its_proxy(sandbox: Any, listen: Any) -> None:
    box = await sandbox({"mode": "allowlist", "allow": ["allowed.test"]})
    (proxy,), _ = _egress_of(box.session_id)
    session_networks = _networks_of(box.id)
    ((session_network, session_side),) = session_networks.items()
    proxy_side = proxy["NetworkSettings"]["Networks"][session_network]["IPAddress"]
    proxy_elsewhere = [
        settings["IPAddress"]
        for name, settings in proxy["NetworkSettings"]["Networks"].items()
        if name != session_network and settings.get("IPAddress")
    ]
    addresses = host_addresses()  # now: with the session's networks made
    listeners = listen(addresses)
    wildcard = listeners.port(listeners.wildcard_tcp)
    reachable = [a for a in addresses if not a.loopback]
    others = sorted({*_gateways(box.session_id), *proxy_elsewhere} - {a.address for a in addresses})
    targets = [
        [proxy_side, PROXY_PORT],  # the control: the one address the sandbox may reach
        *([a.address, listeners.port(listeners.tcp[a.address])] for a in reachable),
        *([a.address, wildcard] for a in reachable),
        *([other, wildcard] for other in others),
    ]
    broadcast = str(
        ipaddress.ip_interface(
            f"{session_side['IPAddress']}/{session_side['IPPrefixLen']}"
        ).network.broadcast_address
    )
    udp_targets = [
        *([a.address, listeners.port(listeners.udp[a.address])] for a in reachable),
        *([a.address, listeners.port(listeners.wildcard_udp)] for a in reachable),
        *([host, listeners.port(listeners.wildcard_udp)]
          for host in ["255.255.255.255", broadcast, "224.0.0.1", "ff02::1", *others]),
    ]  # fmt: skip
    args = json.dumps([targets, udp_targets, CONNECT_TIMEOUT_S, PROBE_THREADS])
    out = await box.python(PROBE, args)
    outcomes = json.loads(out.strip().splitlines()[-1])
    assert len(outcomes) == len(targets), out
    assert outcomes[0] == "accepted", f"the sandbox cannot reach its own proxy: {outcomes[0]}"
    reached = {
        f"{host}:{port}": outcome
        for (host, port), outcome in zip(targets[1:], outcomes[1:], strict=True)
        if outcome not in (UNREACHED_IPV6 if ":" in host else UNREACHED)
    }
    # Accepted: a host service answered. Refused (ECONNREFUSED): the host's kernel answered.
    assert reached == {}, f"the sandbox reached these addresses: {reached}"
    assert listeners.heard() == []
    # And the proxy, on the session's side, its link and upstream, routes nothing between them.
    forwarding = await box.backend.run(
        proxy["Id"], ExecSpec(argv=["cat", "/proc/sys/net/ipv4/ip_forward"], workdir="/"),
        timeout=30, max_output_bytes=64,
    )  # fmt: skip
    assert forwarding.stdout.decode().strip() == "0"
