"""From an effective policy to the Docker create arguments: every setting of DESIGN.md's security
model lives here, in one pure function, so a test can read exactly what a session gets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.backend.base import HOME, SANDBOX_UID, WORKSPACE, ContainerSpec
from orchestrator.backend.docker._seccomp import profile_json

if TYPE_CHECKING:
    from orchestrator.backend.docker._egress import Egress

MIB = 1024 * 1024
# The container's main process (under docker-init, which reaps zombies) is the orphan watchdog:
# every STEP seconds it probes the host lease (worker/lease.py) with an exclusive flock; once it
# has been free for GRACE seconds in a row no orchestrator is attached, and the watchdog exits,
# which stops the container. Only exit status 0 of flock means free: an error keeps the container.
# Without flock(1) in the image it only idles, as the main process always did. dash and sleep
# are a few hundred KiB of a session's memory.
ORPHAN_WATCHDOG = """
command -v flock >/dev/null 2>&1 || exec sleep infinity
grace=$1 step=$2 free=0 lease=/tmp/.sandhold-host-lease
while :; do
  sleep "$step"
  if flock -n -x "$lease" true 2>/dev/null; then free=$((free + step)); else free=0; fi
  [ "$free" -ge "$grace" ] && exit 0
done
"""
# A probe per STEP is cheap, but hundreds of sessions under gVisor pay for every fork: a tenth
# of the grace, within these bounds.
MAX_WATCHDOG_STEP_S = 30
# Our profile in place of the engine's default (``_seccomp``: as strict, io_uring refused too).
SECCOMP_OPTIONS: tuple[str, ...] = (f"seccomp={profile_json()}",)
FIXED_ENV = {
    "HOME": HOME,
    "LANG": "C.UTF-8",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def _tmpfs(size_mb: int, *, mode: str, owned: bool) -> str:
    owner = f",uid={SANDBOX_UID},gid={SANDBOX_UID}" if owned else ""
    return f"rw,nosuid,nodev,size={size_mb}m,mode={mode}{owner}"


def watchdog_command(grace_s: float) -> list[str]:
    grace = max(1, int(grace_s))
    step = max(1, min(MAX_WATCHDOG_STEP_S, grace // 10))
    return ["sh", "-c", ORPHAN_WATCHDOG, "sandhold-watchdog", str(grace), str(step)]


def create_kwargs(
    spec: ContainerSpec, egress: Egress | None = None, *, runtime: str | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``docker.containers.create`` (the high-level SDK call). A policy
    with a network needs its ``egress`` (``_egress.open_egress``): the session joins only that
    internal network and reaches out through the proxy named in its environment. ``runtime``
    is the engine's runtime for the policy's (``egress_runtimes``), the policy's own if None."""
    if (policy_mode := spec.policy.network.mode) != "none" and egress is None:
        raise ValueError(f"network mode {policy_mode} needs the session's egress")
    policy = spec.policy
    res = policy.resources
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": watchdog_command(policy.timeouts.orphan_grace_s),
        "user": f"{SANDBOX_UID}:{SANDBOX_UID}",
        "working_dir": WORKSPACE,
        "environment": {**FIXED_ENV, **(egress.session_env() if egress else {})},
        "hostname": "sandbox",
        "labels": spec.labels,
        "detach": True,
        "stdin_open": False,
        "tty": False,
        # Privileges: none, and no way to regain any.
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true", *SECCOMP_OPTIONS],
        "privileged": False,
        "read_only": True,
        "tmpfs": {
            "/tmp": _tmpfs(  # noqa: S108 (a path inside the container)
                res.tmp_mb, mode="1777", owned=False
            ),
            WORKSPACE: _tmpfs(res.workspace_mb, mode="0755", owned=True),
            HOME: _tmpfs(res.home_mb, mode="0700", owned=True),
        },
        "shm_size": res.shm_mb * MIB,
        "network_mode": "none" if egress is None else egress.network,
        "ipc_mode": "private",
        # Memory == memory + swap: the sandbox cannot page out to grow past its limit.
        "mem_limit": res.memory_mb * MIB,
        "memswap_limit": res.memory_mb * MIB,
        "nano_cpus": int(res.cpus * 1e9),
        "pids_limit": res.pids,
        "ulimits": [
            {"Name": "nofile", "Soft": res.nofile, "Hard": res.nofile},
            {"Name": "fsize", "Soft": res.fsize_mb * MIB, "Hard": res.fsize_mb * MIB},
            {"Name": "core", "Soft": 0, "Hard": 0},
        ],
        "init": True,
        "restart_policy": {"Name": "no"},
        # Nothing a sandbox prints to its main process reaches the host's disk.
        "log_config": {"Type": "none", "Config": {}},
        "oom_kill_disable": False,
        "volumes": {},
        "mounts": [],
    }
    if (runtime := runtime or policy.runtime) is not None:
        kwargs["runtime"] = runtime
    return kwargs


def egress_runtimes(registered: dict[str, Any]) -> dict[str, str | None]:
    """For each runtime registered with ``--network=none`` (``docker info``'s ``Runtimes``),
    the runtime a session with egress runs under instead: ``<name>-egress`` when the engine
    has it with a network, else None. A ``--network=none`` runtime gives its containers only
    loopback whatever network they join (runsc does: gVisor's own network set-up is off), so
    the proxy would be out of reach; its sibling is the same runtime with a network (for runsc
    ``--network=host`` where gVisor's netstack cannot start: the host kernel's stack, in the
    container's own network namespace, which holds only the session's internal network)."""

    def offline(name: str) -> bool:
        return "--network=none" in ((registered.get(name) or {}).get("runtimeArgs") or [])

    return {
        name: (sibling if sibling in registered and not offline(sibling) else None)
        for name in registered
        if offline(name) and not name.endswith("-egress")
        for sibling in [f"{name}-egress"]
    }
