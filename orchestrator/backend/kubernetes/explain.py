"""What each setting of a policy becomes on a Kubernetes Pod (``sandhold policy explain
--backend kubernetes``): read off the Pod ``_spec.pod_manifest`` would make and the keys
``_spec.refusals`` would refuse, so the explanation cannot drift from what the backend does.

Each row is a policy key (or ``(always)`` for what every session Pod gets), its value, what it
becomes on the Pod, and a verdict: ``enforced`` (by the Pod, the node or sandhold's relay in the
Pod), ``refused`` (a session of this policy is not made, with ``invalid_argument`` naming the
key), or ``sandhold`` (enforced by sandhold itself, as on Docker).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from orchestrator.backend.base import ContainerSpec
from orchestrator.backend.kubernetes._settings import KubernetesSettings
from orchestrator.backend.kubernetes._spec import pod_manifest, refusals
from orchestrator.policy.model import Policy

__all__ = ["Explained", "explain_policy"]

Verdict = Literal["enforced", "refused", "sandhold"]
# Sections of a policy sandhold enforces itself, on any backend (the worker, the tool layer).
SANDHOLD_SECTIONS = ("python", "shell", "env", "output", "limits")


@dataclass(frozen=True)
class Explained:
    key: str
    value: str
    becomes: str
    verdict: Verdict

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def explain_policy(policy: Policy, settings: KubernetesSettings) -> list[Explained]:
    """The rows for ``policy`` on a cluster the operator described with ``settings``."""
    spec = ContainerSpec(
        image="<worker image>",
        policy=policy,
        session_id="explain",
        tenant="explain",
        orchestrator_id="explain",
    )
    manifest = pod_manifest(spec, settings, annotations={})
    pod = manifest["spec"]
    [container] = pod["containers"]
    refused = dict(refusals(spec, settings))
    res = policy.resources
    rows = [
        Explained("(always)", "", _posture(container["securityContext"]), "enforced"),
        Explained(
            "(seccomp)",
            settings.seccomp_profile,
            f"seccompProfile {_compact(container['securityContext']['seccompProfile'])}"
            + (
                ": sandhold's own profile (io_uring refused), which must be on every node"
                if settings.seccomp_profile.startswith("localhost/")
                else ": the container runtime's default profile"
            ),
            "enforced",
        ),
        Explained(
            "resources.memory_mb",
            str(res.memory_mb),
            f"requests.memory = limits.memory = {container['resources']['limits']['memory']}",
            "enforced",
        ),
        Explained(
            "resources.cpus",
            f"{res.cpus:g}",
            f"requests.cpu = limits.cpu = {container['resources']['limits']['cpu']} "
            "(a node holds its allocatable CPU divided by this)",
            "enforced",
        ),
        _row(
            refused,
            "resources.pids",
            str(res.pids),
            f"the nodes' kubelet podPidsLimit ({settings.pod_pids_limit}, the operator's word)",
        ),
        Explained(
            "resources.nofile",
            str(res.nofile),
            "RLIMIT_NOFILE, hard and soft, set by sandhold's relay at every exec",
            "enforced",
        ),
        Explained(
            "resources.fsize_mb",
            str(res.fsize_mb),
            "RLIMIT_FSIZE, hard and soft, set by sandhold's relay at every exec",
            "enforced",
        ),
    ]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["volumes"]}
    for key, volume in (
        ("tmp_mb", "tmp"),
        ("workspace_mb", "workspace"),
        ("home_mb", "home"),
        ("shm_mb", "shm"),
    ):
        rows.append(
            Explained(
                f"resources.{key}",
                str(getattr(res, key)),
                f"{mounts[volume]}: emptyDir medium Memory, sizeLimit {volumes[volume]} "
                "(counted against the Pod's memory)",
                "enforced",
            )
        )
    rows.append(
        _row(
            refused,
            "network.mode",
            policy.network.mode,
            "a Pod network that reaches nothing (the operator's word: network_isolated)",
        )
    )
    rows.append(
        _row(
            refused,
            "timeouts.idle_action",
            policy.timeouts.idle_action,
            "an idle session is destroyed: its Pod deleted",
        )
    )
    rows.append(
        Explained(
            "timeouts.orphan_grace_s",
            f"{policy.timeouts.orphan_grace_s:g}",
            "the Pod's main process (the orphan watchdog) ends it after this long with no "
            "orchestrator holding its lease; restartPolicy Never",
            "enforced",
        )
    )
    runtime_class = pod.get("runtimeClassName")
    rows.append(
        _row(
            refused,
            "runtime",
            policy.runtime or "(the default)",
            f"runtimeClassName {runtime_class}"
            if runtime_class
            else "no runtimeClassName: the cluster's default runtime",
        )
    )
    rows += [
        Explained(section, "", "enforced by sandhold, as on Docker", "sandhold")
        for section in SANDHOLD_SECTIONS
    ]
    rows.append(
        Explained(
            "timeouts (others)",
            "",
            "enforced by sandhold, as on Docker",
            "sandhold",
        )
    )
    return rows


def _row(refused: Mapping[str, str], key: str, value: str, becomes: str) -> Explained:
    if key in refused:
        return Explained(key, value, f"refused: {refused[key]}", "refused")
    return Explained(key, value, becomes, "enforced")


def _posture(context: Mapping[str, Any]) -> str:
    return (
        f"runAsUser {context['runAsUser']}, runAsGroup {context['runAsGroup']}, runAsNonRoot, "
        f"capabilities drop {','.join(context['capabilities']['drop'])}, "
        f"allowPrivilegeEscalation {str(context['allowPrivilegeEscalation']).lower()}, "
        f"readOnlyRootFilesystem {str(context['readOnlyRootFilesystem']).lower()}; "
        "no service account token, no service links, imagePullPolicy Never"
    )


def _compact(value: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
