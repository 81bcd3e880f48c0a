"""From an effective policy to the Docker create arguments: every setting of DESIGN.md's security
model lives here, in one pure function, so a test can read exactly what a session gets."""

from __future__ import annotations

from typing import Any

from orchestrator.backend.base import HOME, SANDBOX_UID, WORKSPACE, ContainerSpec

MIB = 1024 * 1024
# The container's main process only has to stay alive; docker-init (--init) reaps zombies.
IDLE_COMMAND = ("sleep", "infinity")
FIXED_ENV = {
    "HOME": HOME,
    "LANG": "C.UTF-8",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def _tmpfs(size_mb: int, *, mode: str, owned: bool) -> str:
    owner = f",uid={SANDBOX_UID},gid={SANDBOX_UID}" if owned else ""
    return f"rw,nosuid,nodev,size={size_mb}m,mode={mode}{owner}"


def create_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """Keyword arguments for ``docker.containers.create`` (the high-level SDK call)."""
    policy = spec.policy
    res = policy.resources
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": list(IDLE_COMMAND),
        "user": f"{SANDBOX_UID}:{SANDBOX_UID}",
        "working_dir": WORKSPACE,
        "environment": dict(FIXED_ENV),
        "hostname": "sandbox",
        "labels": spec.labels,
        "detach": True,
        "stdin_open": False,
        "tty": False,
        # Privileges: none, and no way to regain any.
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "privileged": False,
        # The default seccomp profile applies unless unconfined; nothing here unconfines it.
        "read_only": True,
        "tmpfs": {
            "/tmp": _tmpfs(  # noqa: S108 (a path inside the container)
                res.tmp_mb, mode="1777", owned=False
            ),
            WORKSPACE: _tmpfs(res.workspace_mb, mode="0755", owned=True),
            HOME: _tmpfs(res.home_mb, mode="0700", owned=True),
        },
        "shm_size": res.shm_mb * MIB,
        "network_mode": "none" if policy.network.mode == "none" else "bridge",
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
    if policy.runtime is not None:
        kwargs["runtime"] = policy.runtime
    return kwargs
