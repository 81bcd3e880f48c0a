"""Where the cluster is and who we are to it: ``KubernetesSettings`` (the operator's options) and
the ``ClusterConnection`` made from them (the API server's URL, a TLS context, an auth header, the
namespace), read from a kubeconfig file or from the Pod's own service account in a cluster.

Only what sandhold needs of a kubeconfig is read: a cluster's ``server``,
``certificate-authority`` (file or data) and ``insecure-skip-tls-verify`` (refused: the API
server is always verified); a user's client certificate and key (file or data) or ``token`` /
``tokenFile``; a context's ``namespace``. An exec plugin or an auth provider is refused with a
clear error rather than half-supported.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import InvalidArgumentError

__all__ = ["ClusterConnection", "KubernetesSettings", "connect"]

# Where a Pod finds its service account (Kubernetes' fixed paths).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Seccomp of a session Pod: our own profile placed on every node under kubelet's seccomp root
# (``Localhost``), or the runtime's default where the operator cannot place files.
SECCOMP_RUNTIME_DEFAULT = "RuntimeDefault"
_OPTIONS = {
    "kubeconfig",
    "context",
    "namespace",
    "runtime_class",
    "seccomp_profile",
    "pod_pids_limit",
    "network_isolated",
    "node_selector",
}


@dataclass(frozen=True, kw_only=True)
class KubernetesSettings:
    """The options of ``--backend kubernetes``. What the backend cannot see for itself is the
    operator's word, and the docs say so: ``pod_pids_limit`` (the nodes' kubelet
    ``podPidsLimit``: a policy allowing fewer processes is refused) and ``network_isolated``
    (the Pods' network reaches nothing, as network mode ``none`` requires: an enforcing CNI
    and a deny-all NetworkPolicy, or a cluster built that way)."""

    kubeconfig: Path | None = None
    context: str | None = None
    namespace: str | None = None
    runtime_class: str | None = None
    # ``localhost/<path under kubelet's seccomp root>`` or ``RuntimeDefault``.
    seccomp_profile: str = SECCOMP_RUNTIME_DEFAULT
    pod_pids_limit: int | None = None
    network_isolated: bool = False
    node_selector: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> KubernetesSettings:
        """From ``BackendConfig.options``; an unknown option or a wrong type is refused."""
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise InvalidArgumentError(
                f"unknown kubernetes backend option(s) {', '.join(unknown)}: expected "
                f"{', '.join(sorted(_OPTIONS))}"
            )
        values = dict(options)
        if (kubeconfig := values.get("kubeconfig")) is not None:
            values["kubeconfig"] = Path(kubeconfig)
        for name in ("context", "namespace", "runtime_class", "seccomp_profile"):
            if name in values and not (isinstance(values[name], str) and values[name]):
                raise InvalidArgumentError(f"kubernetes option {name} must be a non-empty string")
        if "pod_pids_limit" in values and not (
            isinstance(values["pod_pids_limit"], int) and values["pod_pids_limit"] > 0
        ):
            raise InvalidArgumentError(
                "kubernetes option pod_pids_limit must be a positive integer"
            )
        if "network_isolated" in values and not isinstance(values["network_isolated"], bool):
            raise InvalidArgumentError("kubernetes option network_isolated must be true or false")
        profile = values.get("seccomp_profile", SECCOMP_RUNTIME_DEFAULT)
        if profile != SECCOMP_RUNTIME_DEFAULT and not profile.startswith("localhost/"):
            raise InvalidArgumentError(
                "kubernetes option seccomp_profile must be RuntimeDefault or localhost/<path>"
            )
        return cls(**values)


@dataclass(frozen=True)
class ClusterConnection:
    server: str
    ssl_context: ssl.SSLContext
    headers: Mapping[str, str]
    namespace: str


def connect(settings: KubernetesSettings) -> ClusterConnection:
    """The connection ``settings`` describe: a kubeconfig (``kubeconfig``, else ``$KUBECONFIG``,
    else, outside a Pod, ``~/.kube/config``) or the Pod's service account."""
    path = settings.kubeconfig
    if path is None and (env := os.environ.get("KUBECONFIG")):
        path = Path(env.split(os.pathsep)[0])
    if path is None and not (SERVICE_ACCOUNT / "token").exists():
        path = Path.home() / ".kube" / "config"
    if path is None:
        return _in_cluster(settings)
    return _from_kubeconfig(path, settings)


def _in_cluster(settings: KubernetesSettings) -> ClusterConnection:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise InvalidArgumentError("no kubeconfig, and not in a Pod (KUBERNETES_SERVICE_HOST)")
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    token = (SERVICE_ACCOUNT / "token").read_text().strip()
    namespace = settings.namespace or (SERVICE_ACCOUNT / "namespace").read_text().strip()
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return ClusterConnection(server, context, {"Authorization": f"Bearer {token}"}, namespace)


def _from_kubeconfig(path: Path, settings: KubernetesSettings) -> ClusterConnection:
    import yaml  # the kubernetes extra; only a kubeconfig needs it

    try:
        config = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidArgumentError(f"kubeconfig {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"kubeconfig {path}: not valid YAML ({exc})") from None
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"kubeconfig {path}: not a kubeconfig")
    name = settings.context or config.get("current-context")
    context = _named(config, "contexts", name, path).get("context") or {}
    cluster = _named(config, "clusters", context.get("cluster"), path).get("cluster") or {}
    user = _named(config, "users", context.get("user"), path).get("user") or {}
    base = path.parent
    if cluster.get("insecure-skip-tls-verify"):
        raise InvalidArgumentError(f"kubeconfig {path}: insecure-skip-tls-verify is refused")
    tls = ssl.create_default_context()
    if ca := cluster.get("certificate-authority-data"):
        tls.load_verify_locations(cadata=base64.b64decode(ca).decode())
    elif ca_file := cluster.get("certificate-authority"):
        tls.load_verify_locations(cafile=str(base / ca_file))
    headers: dict[str, str] = {}
    if user.get("exec") or user.get("auth-provider"):
        raise InvalidArgumentError(
            f"kubeconfig {path}: exec plugins and auth providers are not supported: use a "
            "client certificate or a token"
        )
    if token := user.get("token"):
        headers["Authorization"] = f"Bearer {token}"
    elif token_file := user.get("tokenFile"):
        headers["Authorization"] = f"Bearer {(base / token_file).read_text().strip()}"
    _client_certificate(tls, user, base)
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith("https://"):
        raise InvalidArgumentError(f"kubeconfig {path}: the cluster's server must be https://")
    namespace = settings.namespace or context.get("namespace") or "default"
    return ClusterConnection(server.rstrip("/"), tls, headers, namespace)


def _named(config: dict[str, Any], kind: str, name: Any, path: Path) -> dict[str, Any]:
    for entry in config.get(kind) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    raise InvalidArgumentError(f"kubeconfig {path}: no {kind[:-1]} named {name!r}")


def _client_certificate(tls: ssl.SSLContext, user: dict[str, Any], base: Path) -> None:
    cert, key = user.get("client-certificate"), user.get("client-key")
    if cert and key:
        tls.load_cert_chain(str(base / cert), str(base / key))
        return
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    if cert_data and key_data:
        # ssl loads a chain only from files: a private temporary one, removed at once.
        with tempfile.TemporaryDirectory() as directory:
            pem = Path(directory) / "client.pem"
            pem.touch(mode=0o600)
            pem.write_bytes(base64.b64decode(cert_data) + b"\n" + base64.b64decode(key_data))
            tls.load_cert_chain(str(pem))
