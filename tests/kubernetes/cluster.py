"""The cluster the kubernetes tests run against: the one ``.ci/kube-cluster start`` brings up on
this machine (its admin kubeconfig and the worker image it imported, under
``SANDHOLD_KUBE_RUN``, default ``/run/sandhold-kube``). When it is not there the tests fail under
CI (a skipped cluster test proves nothing) and skip, with the reason, elsewhere.

Each test run works in a namespace of its own, made here and deleted at the end with every Pod in
it; the run fails if a Pod of it is left before that.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backend.kubernetes import KubernetesSettings
from tests.conftest import IN_CI, RUN_ID

RUN = Path(os.environ.get("SANDHOLD_KUBE_RUN", "/run/sandhold-kube"))
# What the cluster enforces, as .ci/kube-cluster builds it (its kubelet's podPidsLimit, Pods
# whose network reaches nothing, sandhold's seccomp profile under kubelet's seccomp root).
CLUSTER_OPTIONS: dict[str, Any] = {
    "seccomp_profile": "localhost/sandhold.json",
    "pod_pids_limit": 256,
    "network_isolated": True,
}
# The second node of ``.ci/kube-cluster start`` (unless SANDHOLD_KUBE_NODES=1).
SECOND_NODE = "sandhold-node-2"
# Namespace creation and the default service account the controller makes: a second or two.
NAMESPACE_READY_TIMEOUT = 60.0
REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    image: str
    namespace: str

    def settings(self, **options: Any) -> KubernetesSettings:
        return KubernetesSettings.from_options(
            {
                "kubeconfig": self.kubeconfig,
                "namespace": self.namespace,
                **CLUSTER_OPTIONS,
                **options,
            }
        )

    def serve_options(self) -> list[str]:
        return [
            "--backend",
            "kubernetes",
            "--kubeconfig",
            str(self.kubeconfig),
            "--namespace",
            self.namespace,
            "--seccomp-profile",
            CLUSTER_OPTIONS["seccomp_profile"],
            "--pod-pids-limit",
            str(CLUSTER_OPTIONS["pod_pids_limit"]),
            "--network-isolated",
        ]

    def api(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """A call to the API server as the admin (the tests' view from outside sandhold)."""
        context = ssl.create_default_context(cafile=str(RUN / "pki" / "ca.crt"))
        context.load_cert_chain(str(RUN / "pki" / "admin.crt"), str(RUN / "pki" / "admin.key"))
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{_server()}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=context, timeout=REQUEST_TIMEOUT) as answer:
            result: dict[str, Any] = json.load(answer)
            return result

    def pods(self) -> list[dict[str, Any]]:
        return list(self.api("GET", f"/api/v1/namespaces/{self.namespace}/pods")["items"])


async def kill_pod_container(cluster: Cluster, pod: str) -> None:
    """SIGKILL the main process of a Pod's container from outside Kubernetes, as the OOM killer
    or a node's operator would: through the node's containerd."""
    import anyio

    found = cluster.api("GET", f"/api/v1/namespaces/{cluster.namespace}/pods/{pod}")
    container = found["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    socket = containerd_socket(found["spec"]["nodeName"])
    argv = ["ctr", "--address", str(socket), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL"]
    await anyio.run_process([*argv, container])


def containerd_socket(node: str) -> Path:
    """The containerd of a node of ``.ci/kube-cluster`` (the second node's has its own)."""
    if node == SECOND_NODE:
        return RUN / "node-2" / "containerd" / "containerd.sock"
    return RUN / "containerd" / "containerd.sock"


def _server() -> str:
    for line in (RUN / "admin.kubeconfig").read_text().splitlines():
        if line.strip().startswith("server:"):
            return line.split(":", 1)[1].strip()
    raise RuntimeError("no server in the admin kubeconfig")


def _problem() -> str | None:
    kubeconfig = RUN / "admin.kubeconfig"
    if not kubeconfig.exists() or not (RUN / "worker-image").exists():
        return f"no cluster of .ci/kube-cluster is up ({kubeconfig} is missing)"
    try:
        Cluster(kubeconfig, "", "default").api("GET", "/api/v1/namespaces/default")
    except (OSError, urllib.error.URLError) as exc:
        return f"the cluster's API server does not answer ({exc})"
    return None


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[Cluster]:
    problem = _problem()
    if problem is not None:
        if IN_CI:
            pytest.fail(f"CI is set and {problem}: the kubernetes tests must run", pytrace=False)
        pytest.skip(problem)
    namespace = f"sandhold-test-{RUN_ID}"
    cluster = Cluster(
        RUN / "admin.kubeconfig", (RUN / "worker-image").read_text().strip(), namespace
    )
    cluster.api("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    try:
        _wait_for_default_account(cluster)
        yield cluster
        left = [p["metadata"]["name"] for p in cluster.pods()]
        if left:
            pytest.fail(f"Pods leaked by this test run: {left}", pytrace=False)
    finally:
        cluster.api("DELETE", f"/api/v1/namespaces/{namespace}?gracePeriodSeconds=0")


def _wait_for_default_account(cluster: Cluster) -> None:
    import time

    deadline = time.monotonic() + NAMESPACE_READY_TIMEOUT
    path = f"/api/v1/namespaces/{cluster.namespace}/serviceaccounts/default"
    while True:
        try:
            cluster.api("GET", path)
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)  # no event to wait on from a blocking client; bounded by the deadline
