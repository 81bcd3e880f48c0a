"""The minimal RBAC Role of docs/kubernetes.md is enough: a user bound to nothing else makes a
session Pod, execs in it (one-shot and attached), lists and removes it, in its namespace, and is
refused in any other."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import anyio
import pytest

from orchestrator.backend.base import ContainerSpec, ExecSpec
from orchestrator.backend.kubernetes import KubernetesBackend
from orchestrator.errors import BackendError
from orchestrator.policy.model import load_policy
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID
from tests.kubernetes.cluster import RUN, Cluster

pytestmark = [pytest.mark.kubernetes, pytest.mark.anyio]

STEP_TIMEOUT = 120.0
# The Role and its binding as docs/kubernetes.md gives them.
RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["create", "get", "list", "watch", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods/exec", "pods/attach"], "verbs": ["create", "get"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]


def _user(tmp_path: Path, name: str) -> Path:
    """A client certificate for ``name``, signed by the cluster's CA, and its kubeconfig."""
    key, csr, crt = (tmp_path / f"user.{ext}" for ext in ("key", "csr", "crt"))
    openssl = ["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key)]
    subprocess.run([*openssl, "-subj", f"/CN={name}", "-out", str(csr)], check=True, timeout=60)
    sign = ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(RUN / "pki" / "ca.crt")]
    sign += ["-CAkey", str(RUN / "pki" / "ca.key"), "-CAcreateserial", "-days", "1"]
    subprocess.run([*sign, "-out", str(crt)], check=True, timeout=60, capture_output=True)
    server = next(
        line.split(":", 1)[1].strip()
        for line in (RUN / "admin.kubeconfig").read_text().splitlines()
        if line.strip().startswith("server:")
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}', "
        f"certificate-authority: '{RUN / 'pki' / 'ca.crt'}'}}}}]\n"
        f"users: [{{name: u, user: {{client-certificate: '{crt}', client-key: '{key}'}}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    return kubeconfig


async def test_the_documented_role_is_all_a_server_needs_in_its_namespace(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    name = f"sandhold-rbac-{RUN_ID}"
    namespace = kube_cluster.namespace
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    kube_cluster.api("POST", f"{rbac}/roles", {"metadata": {"name": name}, "rules": RULES})
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}],
    }
    kube_cluster.api("POST", f"{rbac}/rolebindings", binding)
    kubeconfig = _user(tmp_path, name)
    backend = KubernetesBackend(kube_cluster.settings(kubeconfig=kubeconfig))
    spec = ContainerSpec(
        image=kube_cluster.image,
        policy=load_policy("default"),
        session_id=secrets.token_hex(16),
        tenant="rbac",
        orchestrator_id=TEST_ORCHESTRATOR_ID,
    )
    try:
        with anyio.fail_after(STEP_TIMEOUT):
            await backend.ping()
            pod = await backend.create_container(spec)
            try:
                result = await backend.run(
                    pod, ExecSpec(argv=["id", "-u"]), timeout=STEP_TIMEOUT, max_output_bytes=64
                )
                assert (result.stdout, result.exit_code) == (b"10001\n", 0)
                stream = await backend.open_exec(pod, ExecSpec(argv=["cat"]))
                await stream.send(b"via the role")
                await stream.send_eof()
                assert await stream.receive() == (1, b"via the role")
                await stream.aclose()
                assert [c.id for c in await backend.describe_containers([])] == [pod]
            finally:
                await backend.remove_container(pod)
        elsewhere = KubernetesBackend(
            kube_cluster.settings(kubeconfig=kubeconfig, namespace="default")
        )
        with pytest.raises(BackendError, match="403"):
            await elsewhere.ping()
        await elsewhere.aclose()
    finally:
        await backend.aclose()
        kube_cluster.api("DELETE", f"{rbac}/rolebindings/{name}")
        kube_cluster.api("DELETE", f"{rbac}/roles/{name}")
