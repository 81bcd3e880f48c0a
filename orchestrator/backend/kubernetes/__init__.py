"""The Kubernetes backend: a bare Pod per session, execs through the API server's websocket
channel protocol (docs/kubernetes.md)."""

from orchestrator.backend.kubernetes._settings import KubernetesSettings
from orchestrator.backend.kubernetes._spec import pod_manifest, refusals
from orchestrator.backend.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend", "KubernetesSettings", "pod_manifest", "refusals"]
