"""Whether the cluster honours the seccomp profile session Pods get (``/readyz``'s seccomp line).

``RuntimeDefault`` is the runtime's own profile: always there. A ``Localhost`` profile is a file
the operator places on every node; the API server cannot tell whether it is there, so a probe
Pod asks a node: a Pod with the same profile whose container runs ``true`` either ends
``Succeeded`` (the runtime loaded the profile) or never starts (``CreateContainerError``, the
runtime's message naming the file). The probe Pod has a fixed name per profile (a second
orchestrator, or one that died mid-probe, finds it with a 409 and reads it) and is deleted once
it has answered; it carries no label of a session's, so reconcile never takes it for one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from orchestrator.backend.base import SANDBOX_UID
from orchestrator.backend.kubernetes._settings import KubernetesSettings
from orchestrator.backend.kubernetes._spec import seccomp_field

__all__ = ["LABEL_PROBE", "OK", "probe_manifest", "probe_name", "probe_verdict"]

LABEL_PROBE = "sandhold.probe"
OK = "ok"
# Container states in which a probe Pod has answered: the profile could not be loaded (or the
# Pod could not be made at all, which says nothing about the profile but is no readiness either).
_FAILED = frozenset(
    {
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
        "ErrImageNeverPull",
        "InvalidImageName",
    }
)


def probe_name(settings: KubernetesSettings) -> str:
    digest = hashlib.sha256(settings.seccomp_profile.encode()).hexdigest()[:12]
    return f"sandhold-seccomp-probe-{digest}"


def probe_manifest(settings: KubernetesSettings, image: str) -> dict[str, Any]:
    seccomp = seccomp_field(settings)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "securityContext": {
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "runAsNonRoot": True,
            "seccompProfile": seccomp,
        },
        "containers": [
            {
                "name": "probe",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["true"],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": seccomp,
                },
                # The least a container may ask for: it runs for a moment.
                "resources": {
                    "requests": {"cpu": "10m", "memory": "16Mi"},
                    "limits": {"cpu": "10m", "memory": "16Mi"},
                },
            }
        ],
    }
    if settings.runtime_class is not None:
        pod_spec["runtimeClassName"] = settings.runtime_class
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": probe_name(settings), "labels": {LABEL_PROBE: "seccomp"}},
        "spec": pod_spec,
    }


def probe_verdict(pod: Mapping[str, Any], profile: str) -> str | None:
    """``ok``, what went wrong, or None while the probe Pod has not answered."""
    status = pod.get("status") or {}
    if status.get("phase") == "Succeeded":
        return OK
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _FAILED:
            message = waiting.get("message") or waiting.get("reason")
            return f"seccomp profile {profile} cannot be honoured: {message}"
        terminated = state.get("terminated") or {}
        if terminated and terminated.get("exitCode") != 0:
            return (
                f"seccomp profile {profile}: a probe running true ended with "
                f"{terminated.get('exitCode')} ({terminated.get('reason')})"
            )
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return (
                f"seccomp profile {profile}: no node takes a probe Pod ({condition.get('message')})"
            )
    if status.get("phase") == "Failed":
        return f"seccomp profile {profile}: the probe Pod failed ({status.get('reason')})"
    return None
