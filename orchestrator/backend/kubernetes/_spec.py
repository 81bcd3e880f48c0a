"""From an effective policy to a session's Pod: every setting of the security model on
Kubernetes lives here, in pure functions, as ``backend/docker/_spec.py`` holds Docker's; and
what a Pod cannot enforce is refused here, by name (``refusals``), never silently weakened.

The Pod: one container as the sandbox user (uid and gid 10001, non-root enforced), every
capability dropped, no privilege escalation (no_new_privs), a read-only root, the seccomp
profile the operator chose (``Localhost``: ours on the nodes; else ``RuntimeDefault``),
requests equal to limits (memory, CPU), memory-backed ``emptyDir``s for ``/tmp``,
``/workspace``, the home directory and ``/dev/shm``, no service account token, no service
links, no restart. Its main process is the same orphan watchdog as on Docker, and pid 1 of the
Pod's own process namespace (not shared with the pause container: the re-adoption sweep keeps
the session of pid 1 and kills every other it does not know); as pid 1 it reaps the orphans
that become its children each time it waits for its ``sleep``, within a watchdog step, where
Docker's init reaps at once. The session's labels are
kept whole as annotations (a label value may not hold every tenant name); the few that are
valid label values are labels too, for selectors and ``kubectl``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.backend.base import (
    HOME,
    LABEL_ORCHESTRATOR,
    LABEL_SESSION,
    SANDBOX_UID,
    WORKSPACE,
    ContainerSpec,
)
from orchestrator.backend.kubernetes._settings import SECCOMP_RUNTIME_DEFAULT, KubernetesSettings

__all__ = [
    "CONTAINER",
    "FIXED_ENV",
    "LABEL_MANAGED",
    "pod_labels",
    "pod_manifest",
    "pod_name",
    "refusals",
    "seccomp_field",
    "watchdog_command",
]

CONTAINER = "sandbox"
# Every Pod of ours carries this label: the one selector every listing starts from.
LABEL_MANAGED = "sandhold.managed"
FIXED_ENV = {
    "HOME": HOME,
    "LANG": "C.UTF-8",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
}
# The orphan watchdog of backend/docker/_spec.py, the same script: it ends the Pod's container
# when no orchestrator has held the worker's host lease for the grace.
ORPHAN_WATCHDOG = """
command -v flock >/dev/null 2>&1 || exec sleep infinity
grace=$1 step=$2 free=0 lease=/tmp/.sandhold-host-lease
while :; do
  sleep "$step"
  if flock -n -x "$lease" true 2>/dev/null; then free=$((free + step)); else free=0; fi
  [ "$free" -ge "$grace" ] && exit 0
done
"""
MAX_WATCHDOG_STEP_S = 30
# The least grace Kubernetes keeps a deleted Pod's object for until kubelet has stopped it.
TERMINATION_GRACE_S = 1
# A label value: at most 63 characters of [A-Za-z0-9._-], alphanumeric at both ends.
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")
# A Pod name is a DNS-1123 subdomain; ``sandhold-`` and a session id (hex) always is one.
_POD_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def seccomp_field(settings: KubernetesSettings) -> dict[str, str]:
    """The ``seccompProfile`` of a session Pod (and of the readiness probe's)."""
    if settings.seccomp_profile == SECCOMP_RUNTIME_DEFAULT:
        return {"type": SECCOMP_RUNTIME_DEFAULT}
    return {
        "type": "Localhost",
        "localhostProfile": settings.seccomp_profile.removeprefix("localhost/"),
    }


def watchdog_command(grace_s: float) -> list[str]:
    grace = max(1, int(grace_s))
    step = max(1, min(MAX_WATCHDOG_STEP_S, grace // 10))
    return ["sh", "-c", ORPHAN_WATCHDOG, "sandhold-watchdog", str(grace), str(step)]


def pod_name(session_id: str) -> str:
    name = f"sandhold-{session_id.lower()}"
    if _POD_NAME.match(name):
        return name
    return f"sandhold-{hashlib.sha256(session_id.encode()).hexdigest()[:40]}"


def pod_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels of a session's Pod: ours, and those of the session's that are valid values."""
    chosen = {LABEL_MANAGED: "true"}
    for key in (LABEL_SESSION, LABEL_ORCHESTRATOR):
        if (value := labels.get(key)) is not None and _LABEL_VALUE.match(value):
            chosen[key] = value
    return chosen


def refusals(spec: ContainerSpec, settings: KubernetesSettings) -> list[tuple[str, str]]:
    """The policy keys this backend cannot enforce for ``spec``, each with the reason: a session
    is made only when this is empty."""
    policy = spec.policy
    found: list[tuple[str, str]] = []
    pids = policy.resources.pids
    if settings.pod_pids_limit is None:
        found.append(
            (
                "resources.pids",
                "a Pod's process limit is the nodes' kubelet podPidsLimit, and "
                "the backend was not told it (option pod_pids_limit)",
            )
        )
    elif settings.pod_pids_limit > pids:
        found.append(
            (
                "resources.pids",
                f"the nodes allow {settings.pod_pids_limit} processes per Pod, "
                f"more than the policy's {pids}",
            )
        )
    mode = policy.network.mode
    if mode != "none":
        found.append(
            (
                "network.mode",
                f"network mode {mode} needs sandhold's egress proxy, which this "
                "backend does not run",
            )
        )
    elif not settings.network_isolated:
        found.append(
            (
                "network.mode",
                "mode none needs Pods whose network reaches nothing (an enforcing "
                "CNI with a deny-all NetworkPolicy), and the backend was not told the cluster has "
                "it (option network_isolated)",
            )
        )
    if policy.timeouts.idle_action == "pause":
        found.append(("timeouts.idle_action", "a Pod cannot be frozen (pause)"))
    if policy.runtime == "runsc" and settings.runtime_class is None:
        found.append(("runtime", "runsc needs a RuntimeClass for gVisor (option runtime_class)"))
    return found


def pod_manifest(
    spec: ContainerSpec, settings: KubernetesSettings, *, annotations: Mapping[str, str]
) -> dict[str, Any]:
    """The Pod of a session; ``annotations`` are the session's labels whole (``pod_annotations``
    in ``backend``) and anything else the backend keeps on the Pod."""
    policy = spec.policy
    res = policy.resources
    memory = f"{res.memory_mb}Mi"
    cpu = f"{round(res.cpus * 1000)}m"
    seccomp = seccomp_field(settings)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "shareProcessNamespace": False,
        "hostname": "sandbox",
        # Deleted from outside, a Pod's object goes only once kubelet has stopped it (sandhold's
        # own removal asks for 0); the watchdog has nothing to wind down.
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": {
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "runAsNonRoot": True,
            "fsGroup": SANDBOX_UID,
            "seccompProfile": seccomp,
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": spec.image,
                # No registry: the nodes hold the images (docs/kubernetes.md says how).
                "imagePullPolicy": "Never",
                "command": watchdog_command(policy.timeouts.orphan_grace_s),
                "workingDir": WORKSPACE,
                "env": [{"name": k, "value": v} for k, v in FIXED_ENV.items()],
                "stdin": False,
                "tty": False,
                "securityContext": {
                    "runAsUser": SANDBOX_UID,
                    "runAsGroup": SANDBOX_UID,
                    "runAsNonRoot": True,
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": seccomp,
                },
                "resources": {
                    "requests": {"memory": memory, "cpu": cpu},
                    "limits": {"memory": memory, "cpu": cpu},
                },
                "volumeMounts": [
                    {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 (inside the Pod)
                    {"name": "workspace", "mountPath": WORKSPACE},
                    {"name": "home", "mountPath": HOME},
                    {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 (inside the Pod)
                ],
                "terminationMessagePolicy": "File",
            }
        ],
        "volumes": [
            _memory_volume("tmp", res.tmp_mb),
            _memory_volume("workspace", res.workspace_mb),
            _memory_volume("home", res.home_mb),
            _memory_volume("shm", res.shm_mb),
        ],
    }
    if (runtime_class := settings.runtime_class) is not None:
        pod_spec["runtimeClassName"] = runtime_class
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(spec.session_id),
            "labels": pod_labels(spec.labels),
            "annotations": dict(annotations),
        },
        "spec": pod_spec,
    }


def _memory_volume(name: str, size_mb: int) -> dict[str, Any]:
    # Memory-backed, sized: counted against the Pod's memory limit as Docker's tmpfs is; the
    # tmpfs itself is sized only where kubelet has SizeMemoryBackedVolumes (beta from 1.22),
    # else kubelet evicts a Pod that writes past the size.
    return {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": f"{size_mb}Mi"}}
