"""``/readyz`` on the kubernetes backend says which seccomp profile session Pods get, and is
ready only once the nodes are seen to honour it (a probe Pod with the profile ran ``true``): a
``Localhost`` profile that no node holds keeps it 503, naming the file; the probe Pod is removed
either way. Against the cluster of ``.ci/kube-cluster``."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.docker.test_serve import STOP_TIMEOUT, running
from tests.kubernetes.cluster import Cluster

pytestmark = [pytest.mark.kubernetes, pytest.mark.anyio]

# A probe Pod starts and ends in seconds; /readyz is polled until it has answered.
PROBE_TIMEOUT = 120.0


async def settled_readyz(url: str) -> tuple[int, dict[str, Any]]:
    """/readyz once its seccomp line no longer says the probe is under way."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        with anyio.fail_after(PROBE_TIMEOUT):
            while True:
                answer = await http.get("/readyz")
                body: dict[str, Any] = answer.json()
                seccomp = [v for k, v in body["checks"].items() if k.startswith("seccomp ")]
                if seccomp and not seccomp[0].startswith("checking"):
                    return answer.status_code, body
                await anyio.sleep(0.5)


async def test_readyz_names_the_seccomp_profile_and_is_ready_once_a_node_honours_it(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    async with running(kube_cluster.image, tmp_path, *kube_cluster.serve_options()) as server:
        status, body = await settled_readyz(server.url)
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
    assert status == 200, body
    assert body["checks"]["seccomp localhost/sandhold.json"] == "ok"
    assert kube_cluster.pods() == []  # the probe Pod went once it had answered


async def test_readyz_is_503_naming_a_localhost_profile_no_node_holds(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    options = kube_cluster.serve_options()
    options[options.index("localhost/sandhold.json")] = "localhost/no-such-profile.json"
    async with running(kube_cluster.image, tmp_path, *options) as server:
        status, body = await settled_readyz(server.url)
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
    assert status == 503, body
    assert body["not_ready"] == ["seccomp localhost/no-such-profile.json"]
    answer = body["checks"]["seccomp localhost/no-such-profile.json"]
    assert "cannot be honoured" in answer and "no-such-profile.json" in answer, answer
    assert kube_cluster.pods() == []


async def test_readyz_with_runtime_default_is_ready_without_a_probe(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    options = kube_cluster.serve_options()
    options[options.index("localhost/sandhold.json")] = "RuntimeDefault"
    async with running(kube_cluster.image, tmp_path, *options) as server:
        status, body = await settled_readyz(server.url)
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
    assert status == 200, body
    assert body["checks"]["seccomp RuntimeDefault"] == "ok"
