"""Node loss on the two-node cluster of ``.ci/kube-cluster start`` (its default):
sessions spread over both nodes; the second node's kubelet killed (its containerd and the
session's container keep running, as on a node cut off from the cluster) makes the session on
it answer ``session_lost`` once the node controller has marked the node not ready (its grace,
20 s on the test cluster, bounds it), never ``internal``, while the session on the first node
keeps its state and answers, and a new session is made (on the first node). The kubelet is
started again at the end."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.conftest import IN_CI
from tests.docker.test_serve import STOP_TIMEOUT, running
from tests.kubernetes.cluster import SECOND_NODE, Cluster

pytestmark = [pytest.mark.kubernetes, pytest.mark.anyio]

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "kube-cluster"
CALL_TIMEOUT = 120.0
# The node controller's grace (.ci/kube-cluster: NODE_GRACE_S, 20 s) and its 2 s period, a
# status round, and the reconcile that ends the session: well within this.
LOSS_BOUND_S = 150.0
# A session's Pod per node: 1-CPU sessions on 2-CPU nodes, the scheduler spreading them.
MAX_SESSIONS_TO_SPREAD = 4
# Between two calls on the lost node's session while the loss is not yet known.
POLL_S = 1.0


@pytest.fixture
def two_nodes(kube_cluster: Cluster) -> Cluster:
    names = [n["metadata"]["name"] for n in kube_cluster.api("GET", "/api/v1/nodes")["items"]]
    if SECOND_NODE not in names:
        problem = f"the cluster has no second node (nodes: {names}; SANDHOLD_KUBE_NODES=1?)"
        if IN_CI:
            pytest.fail(f"CI is set and {problem}", pytrace=False)
        pytest.skip(problem)
    return kube_cluster


def node_of(cluster: Cluster, sid: str) -> str:
    [pod] = [p for p in cluster.pods() if sid in p["metadata"]["name"]]
    return str(pod["spec"]["nodeName"])


async def ok(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def kubelet_2(action: str) -> None:
    with anyio.fail_after(CALL_TIMEOUT * 2):
        await anyio.run_process(
            ["bash", str(SCRIPT), "kubelet-2", action], stderr=subprocess.STDOUT
        )


async def test_losing_a_node_loses_its_sessions_in_bounded_time_and_the_others_keep_working(
    two_nodes: Cluster, tmp_path: Path
) -> None:
    cluster = two_nodes
    async with running(cluster.image, tmp_path, *cluster.serve_options()) as server:
        key = server.notice.rsplit(": ", 1)[1]
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, timeout=CALL_TIMEOUT
        ) as http:
            on_node: dict[str, str] = {}
            for index in range(MAX_SESSIONS_TO_SPREAD):
                made = await ok(await http.post("/v1/sessions", json={"code": f"x = {index}"}))
                on_node.setdefault(node_of(cluster, made["session_id"]), made["session_id"])
                if len(on_node) == 2:
                    break
            assert len(on_node) == 2, f"sessions did not spread over both nodes: {on_node}"
            kept = next(sid for node, sid in on_node.items() if node != SECOND_NODE)
            doomed = on_node[SECOND_NODE]
            kept_value = (
                await ok(await http.post(f"/v1/sessions/{kept}/execute", json={"code": "x"}))
            )["result_repr"]

            await kubelet_2("kill")
            killed = time.monotonic()
            try:
                answers: list[str] = []
                with anyio.fail_after(LOSS_BOUND_S):
                    while not answers or answers[-1] != "session_lost":
                        answer = await http.post(
                            f"/v1/sessions/{doomed}/execute", json={"code": "x"}
                        )
                        body = answer.json()
                        answers.append(body.get("error_type") or "ok")
                        assert answers[-1] != "internal", body
                        still = await ok(
                            await http.post(f"/v1/sessions/{kept}/execute", json={"code": "x"})
                        )
                        assert still["result_repr"] == kept_value
                        if answers[-1] != "session_lost":
                            await anyio.sleep(POLL_S)
                # For the log (-s): what the lost node's session answered, and how soon.
                print(f"lost after {time.monotonic() - killed:.1f} s, answers: {answers}")
                assert all(
                    a
                    in (
                        "ok",
                        "backend_unavailable",
                        "session_lost",
                        "process_crashed",
                        "state_reset",
                    )
                    for a in answers
                ), answers
                assert not any(doomed in p["metadata"]["name"] for p in cluster.pods())
                fresh = await ok(await http.post("/v1/sessions", json={"code": "1 + 1"}))
                assert fresh["result_repr"] == "2"
                assert node_of(cluster, fresh["session_id"]) != SECOND_NODE
                for sid in (kept, fresh["session_id"]):
                    await ok(await http.delete(f"/v1/sessions/{sid}"))
            finally:
                with anyio.CancelScope(shield=True):
                    await kubelet_2("start")
        server.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_TIMEOUT):
            await server.process.wait()
