"""A private Docker engine for fault tests: its own ``containerd`` and ``dockerd``, so that a test
may stop, restart or freeze the engine without touching the machine's (other engineers'
containers run on it).

Everything it has is its own: a data root and an exec root under one temporary directory, its
own API socket, its own containerd socket (never ``/run/containerd/containerd.sock``, which a
``dockerd`` left to itself would pick up when present), its own daemon config file (the machine's
``/etc/docker/daemon.json`` is not read), a network namespace of its own, made here and removed
on close (a dockerd in the host's namespace takes the host's ``docker0`` for its own: told
``--bridge=none`` or another bridge, it deletes it when it starts), no iptables rules, a cgroup
parent of its own, address pools in ``10.231.0.0/16``.
Sessions with a network get their upstream from ``UPSTREAM_NETWORK``, an internal network made
here (nothing is ever sent beyond it).

Invariants: ``close`` stops both daemons (TERM, a bounded wait, then KILL) and removes the
directory and the cgroups it made, whatever state a test left the engine in (a frozen engine is
thawed first). Only processes this object started are ever signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import docker

__all__ = ["UPSTREAM_NETWORK", "PrivateEngine"]

# Daemons start in about a second on an idle machine; a loaded 2-core machine takes longer.
START_TIMEOUT = 60.0
# dockerd stops every container on TERM (no live-restore): 10 s of grace each, in parallel.
STOP_TIMEOUT = 40.0
# Loading the worker image (~160 MB) from the machine's engine takes a few seconds.
LOAD_TIMEOUT = 300.0
# Engine calls of the fixture itself are local and small.
API_TIMEOUT = 30.0
ADDRESS_POOL = "10.231.0.0/16"
# Sessions' egress networks are carved from here (``SANDHOLD_EGRESS_SUBNETS``), within the pool.
EGRESS_SUBNETS = "10.231.128.0/17"
# Sorts before the session networks (sandhold-egress-…): Docker routes the proxies through it.
UPSTREAM_NETWORK = "faults-upstream"
UPSTREAM_SUBNET = "10.231.1.0/24"
CGROUP_ROOT = Path("/sys/fs/cgroup")


class PrivateEngine:
    def __init__(self, *, machine_host: str | None = None) -> None:
        # Short: socket paths under it must fit sun_path (108 bytes).
        self.root = Path(tempfile.mkdtemp(prefix="shf-", dir="/tmp"))
        self.name = f"sandhold-faults-{secrets.token_hex(4)}"
        self.socket = self.root / "docker.sock"
        self._containerd_socket = self.root / "x" / "containerd.sock"
        self._machine_host = machine_host
        # dockerd's network namespace (its docker0, its containers' links): never the host's.
        self.netns = f"shf-{secrets.token_hex(4)}"
        self._containerd: subprocess.Popen[bytes] | None = None
        self._dockerd: subprocess.Popen[bytes] | None = None
        self.frozen = False

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def dockerd_pid(self) -> int:
        assert self._dockerd is not None
        return self._dockerd.pid

    def __enter__(self) -> Self:
        try:
            self._make_netns()
            self._start_containerd()
            self.start()
            self._make_upstream()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.docker_host, timeout=API_TIMEOUT)

    # -- the daemons -------------------------------------------------------------------------

    def _start_containerd(self) -> None:
        config = self.root / "containerd.toml"
        config.write_text(
            "version = 2\n"
            f'root = "{self.root}/d/containerd"\n'
            f'state = "{self.root}/x/containerd"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self._containerd_socket}"\n'
            f'[ttrpc]\n  address = "{self._containerd_socket}.ttrpc"\n'
            '[debug]\n  address = ""\n'
            '[metrics]\n  address = ""\n'
        )
        (self.root / "x").mkdir(exist_ok=True)
        with (self.root / "containerd.log").open("ab") as out:
            self._containerd = subprocess.Popen(
                ["containerd", "--config", str(config)],
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        _wait_for(lambda: self._containerd_socket.exists(), "containerd's socket")

    def start(self) -> None:
        """Start ``dockerd`` (again, after ``stop``) and wait until it answers a ping."""
        assert self._dockerd is None, "dockerd is already running"
        config = self.root / "daemon.json"
        config.write_text(json.dumps({}))
        command = [
            # nsenter execs dockerd (the pid stays its own) and, unlike `ip netns exec`, keeps
            # the host's /sys (and so its cgroup mounts).
            "nsenter",
            f"--net=/run/netns/{self.netns}",
            "dockerd",
            f"--config-file={config}",
            f"--data-root={self.root}/d/docker",
            f"--exec-root={self.root}/x/docker",
            f"--pidfile={self.root}/dockerd.pid",
            f"--host={self.docker_host}",
            f"--containerd={self._containerd_socket}",
            "--iptables=false",
            "--ip-masq=false",
            "--ip-forward=false",
            "--storage-driver=overlay2",
            f"--default-address-pool=base={ADDRESS_POOL},size=28",
            f"--cgroup-parent=/{self.name}",
            "--exec-opt=native.cgroupdriver=cgroupfs",
        ]
        with (self.root / "dockerd.log").open("ab") as out:
            self._dockerd = subprocess.Popen(
                command, stdout=out, stderr=out, start_new_session=True
            )
        _wait_for(self._answers, "the private dockerd's ping")

    def stop(self) -> None:
        """Stop ``dockerd`` as a service manager would (TERM): without live-restore it stops
        every container first. containerd stays, as it does on a real host."""
        process, self._dockerd = self._dockerd, None
        if process is None:
            return
        if self.frozen:
            self.thaw(process.pid)
        _terminate(process)

    def ensure_up(self) -> None:
        """Thawed and running, whatever a test left it as."""
        if self.frozen:
            self.thaw()
        if self._dockerd is None:
            self.start()

    def restart(self) -> None:
        self.stop()
        self.start()

    def freeze(self) -> None:
        """SIGSTOP to dockerd: its API and every stream it relays stall; containers run on."""
        os.kill(self.dockerd_pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self, pid: int | None = None) -> None:
        os.kill(pid or self.dockerd_pid, signal.SIGCONT)
        self.frozen = False

    def _answers(self) -> bool:
        if self._dockerd is not None and self._dockerd.poll() is not None:
            log = (self.root / "dockerd.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the private dockerd exited: {log}")
        try:
            client = self.client()
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    # -- contents ----------------------------------------------------------------------------

    def load_image(self, tag: str) -> None:
        """``docker save`` from the machine's engine, ``docker load`` into this one."""
        machine = ["docker"] if self._machine_host is None else ["docker", "-H", self._machine_host]
        with subprocess.Popen([*machine, "save", tag], stdout=subprocess.PIPE) as save:
            load = subprocess.run(
                ["docker", "-H", self.docker_host, "load"],
                stdin=save.stdout,
                capture_output=True,
                timeout=LOAD_TIMEOUT,
                check=False,
            )
            assert save.stdout is not None
            save.stdout.close()
            save.wait(LOAD_TIMEOUT)
        if save.returncode != 0 or load.returncode != 0:
            raise RuntimeError(f"loading {tag} failed: {load.stderr.decode(errors='replace')}")

    def _make_upstream(self) -> None:
        client = self.client()
        try:
            ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(UPSTREAM_SUBNET)])
            client.networks.create(UPSTREAM_NETWORK, driver="bridge", internal=True, ipam=ipam)
        finally:
            client.close()

    def leftovers(self, label: str) -> dict[str, list[str]]:
        """Containers (any state) and networks carrying ``label`` (``key=value``)."""
        client = self.client()
        try:
            containers = client.api.containers(all=True, filters={"label": label})
            networks = client.api.networks(filters={"label": label})
        finally:
            client.close()
        return {
            "containers": [f"{c['Id'][:12]} {c['State']} {c['Names']}" for c in containers],
            "networks": [n["Name"] for n in networks],
        }

    # -- teardown ----------------------------------------------------------------------------

    def _make_netns(self) -> None:
        for command in (
            ["ip", "netns", "add", self.netns],
            ["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"],
        ):
            subprocess.run(command, capture_output=True, check=True, timeout=API_TIMEOUT)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._dockerd is not None and self.frozen:
                self.thaw()
            if self._dockerd is not None and self._answers():
                self._remove_everything()
        self.stop()
        process, self._containerd = self._containerd, None
        if process is not None:
            _terminate(process)
        _unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)
        subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True, check=False)
        for controller in CGROUP_ROOT.glob(f"*/{self.name}"):
            for child in sorted(controller.rglob("*"), reverse=True):
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                controller.rmdir()

    def _remove_everything(self) -> None:
        client = self.client()
        try:
            for container in client.api.containers(all=True):
                client.api.remove_container(container["Id"], force=True)
            for network in client.api.networks():
                if network["Name"] not in {"none", "host"}:
                    client.api.remove_network(network["Id"])
        finally:
            client.close()


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_TIMEOUT)


def _unmount_under(root: Path) -> None:
    """Unmount what the daemons left mounted under ``root`` (a killed one leaves overlays and
    its netns files), deepest first, so the directory can be removed."""
    prefix = f"{root}/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


def _wait_for(ready: object, what: str) -> None:
    assert callable(ready)
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {START_TIMEOUT:g} s")
        time.sleep(0.1)
